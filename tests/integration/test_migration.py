"""Request migration: a decode worker that dies or stalls mid-stream does not lose the stream.
The control plane resumes the request on another worker from the prompt plus the tokens already
sent, and the caller's stream continues with no gap and no repeat: greedy output (tokens and
text) equals an uninterrupted run. A stalled worker leaves routing; new requests avoid it."""

from __future__ import annotations

import signal
import time

import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster
from kvplane.errors import UnavailableError

from .helpers import assert_nothing_pinned, interrupted_stream, metric_sum, paced_sim_agents, prompt_ids, scrape

pytestmark = pytest.mark.cluster  # starts processes

MAX_TOKENS = 600  # 6 s of paced steps (paced_sim_agents): long enough to interrupt mid-stream


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("migration")
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, log_dir=log_dir, agent_args=paced_sim_agents(log_dir),
        controlplane_args=("--token-timeout", "2", "--silent-after-s", "1.5"),
    ) as cluster:  # fmt: skip
        yield cluster


def test_a_killed_decode_worker_mid_stream_migrates_without_gap_or_repeat(cluster):
    prompt = prompt_ids(seed=60, length=40)
    with Client(cluster.endpoint, timeout=120) as client:
        reference = client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
        cp_metrics = client.stats().metrics_url
        before = metric_sum(scrape(cp_metrics), "kvplane_request_migrations_total", kvplane_migration_reason="worker_failed")
        tokens, text, metrics, victim = interrupted_stream(client, cluster, prompt, signal.SIGKILL, MAX_TOKENS)
        after = metric_sum(scrape(cp_metrics), "kvplane_request_migrations_total", kvplane_migration_reason="worker_failed")
    assert tuple(tokens) == reference.token_ids and text == reference.text
    assert metrics.num_migrations == 1 and metrics.decode_worker != victim
    assert metrics.prompt_tokens == len(prompt)
    assert after - before == 1
    cluster.restart_agent(victim, timeout=90)
    with Client(cluster.endpoint, timeout=60) as client:
        assert_nothing_pinned(cluster, client)


def test_a_stopped_decode_worker_stalls_its_stream_which_moves_and_new_requests_avoid_it(cluster):
    prompt = prompt_ids(seed=61, length=40)
    with Client(cluster.endpoint, timeout=120) as client:
        reference = client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
        tokens, text, metrics, victim = interrupted_stream(client, cluster, prompt, signal.SIGSTOP, MAX_TOKENS)
        try:
            assert tuple(tokens) == reference.token_ids and text == reference.text
            assert metrics.num_migrations == 1 and metrics.decode_worker != victim
            # While it is stopped (its lease still alive), new requests go elsewhere at once.
            started = time.monotonic()
            for seed in range(3):
                other = client.generate(prompt_ids(seed=70 + seed, length=40), max_tokens=8)
                assert other.metrics.decode_worker != victim
            assert time.monotonic() - started < 10
        finally:
            cluster.kill(victim, signal.SIGCONT)
        # Resumed, it finds its stream cancelled and frees everything.
        assert_nothing_pinned(cluster, client)


def test_without_migrations_a_dead_worker_ends_the_stream_naming_it(tmp_path):
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, log_dir=tmp_path, controlplane_args=("--max-migrations", "0"),
        agent_args=paced_sim_agents(tmp_path),
    ) as cluster, Client(cluster.endpoint, timeout=120) as client:  # fmt: skip
        with pytest.raises(UnavailableError) as info:
            interrupted_stream(client, cluster, prompt_ids(seed=62, length=40), signal.SIGKILL, MAX_TOKENS)
        assert_nothing_pinned(cluster, client)
    message = str(info.value)
    assert "decode worker both-" in message and "failed after" in message, message
    assert "cannot reach the kvplane control plane" not in message

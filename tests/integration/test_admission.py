"""Threshold admission: when every worker is over its limits the request is rejected at once,
with a retry-after hint and a reason, through the SDK's typed exception; capacity coming back
admits requests again.

The agents pace their engine steps (paced_sim_agents), and the requests that fill the worker run
until the test stops them: what is running when a request arrives does not depend on how fast a
loaded machine generates tokens."""

from __future__ import annotations

import threading

import pytest

from kvplane import Client, RejectedError
from kvplane.apps.cluster import LocalCluster

from .helpers import metric_sum, paced_sim_agents, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes

LIMITS = ("--max-running", "1")
AGENT_LIMITS = ("--max-tokens-limit", "1900")
HOLD_TOKENS = 1800  # 18 s of paced steps: a held request is stopped by the test long before it ends


class Saturation:
    """Two streaming requests that keep the worker over its limit of one running request until
    `release()` cancels them (leaving a stream's loop cancels its request)."""

    def __init__(self, client: Client, seeds: tuple[int, int]) -> None:
        self._client = client
        self._stop = threading.Event()
        self.finish_reasons: list[str] = []
        self._threads = [threading.Thread(target=self._hold, args=(seed,)) for seed in seeds]

    def _hold(self, seed: int) -> None:
        for chunk in self._client.stream(prompt_ids(seed=seed, length=20), max_tokens=HOLD_TOKENS, ignore_eos=True):
            if chunk.finished:
                self.finish_reasons.append(chunk.finish_reason)
            if self._stop.is_set():
                return

    def __enter__(self) -> Saturation:
        for thread in self._threads:
            thread.start()
        wait_for(lambda: self._client.workers()[0].load.num_running == 2, timeout=30, what="a saturated worker")
        return self

    def release(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        assert not any(t.is_alive() for t in self._threads), "a saturating stream did not stop"
        assert self.finish_reasons == [], f"a saturating request ended on its own ({self.finish_reasons}) while the test relied on it"

    def __exit__(self, *exc) -> None:
        self._stop.set()


def _cluster(tmp_path, *controlplane_args: str) -> LocalCluster:
    return LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, controlplane_args=LIMITS + controlplane_args,
        agent_args=paced_sim_agents(tmp_path) + AGENT_LIMITS, log_dir=tmp_path,
    )  # fmt: skip


def _rejections(metrics_url: str) -> float:
    return metric_sum(scrape(metrics_url), "kvplane_admission_decisions_total", kvplane_admission_decision="reject")


def test_overloaded_cluster_rejects_with_retry_after(tmp_path):
    with _cluster(tmp_path, "--max-waiting", "1") as cluster, Client(cluster.endpoint, timeout=120) as client:
        with Saturation(client, seeds=(40, 42)) as saturation:
            # The load report shows both running: one over the limit of one.
            with pytest.raises(RejectedError) as info:
                client.generate(prompt_ids(seed=41, length=10), max_tokens=2)
            saturation.release()
        wait_for(lambda: client.workers()[0].load.num_running == 0, timeout=10, what="the worker to be idle")
        after = client.generate(prompt_ids(seed=41, length=10), max_tokens=2)
    assert info.value.retry_after_s is not None and info.value.retry_after_s >= 1.0
    assert "running 2>1" in info.value.reason
    assert "rejected at admission" in str(info.value)
    assert len(after.token_ids) == 2


def test_batch_requests_wait_instead_of_being_rejected_and_are_shed_for_interactive(tmp_path):
    with _cluster(tmp_path, "--max-waiting", "8") as cluster, Client(cluster.endpoint, timeout=120) as client:
        metrics_url = client.stats().metrics_url
        outcome: dict = {}

        def run_batch(seed: int) -> None:
            try:
                outcome["result"] = client.generate(prompt_ids(seed=seed, length=10), max_tokens=2, priority="batch")
            except RejectedError as e:
                outcome["error"] = e

        def queued_batch(seed: int) -> threading.Thread:
            # A waiting batch request asks admission again every 50 ms; two rejections mean it has
            # entered the queue and is waiting there.
            before = _rejections(metrics_url)
            batch = threading.Thread(target=run_batch, args=(seed,))
            batch.start()
            wait_for(lambda: _rejections(metrics_url) >= before + 2, timeout=30, what="the batch request to wait in the queue")
            return batch

        # 1. A batch request waits for room and completes once there is room.
        with Saturation(client, seeds=(50, 51)) as saturation:
            batch = queued_batch(seed=52)
            assert batch.is_alive(), f"the batch request did not wait: {outcome}"
            saturation.release()
            batch.join(60)
        waited = outcome.pop("result")
        assert len(waited.token_ids) == 2 and waited.metrics.priority == "batch"
        assert waited.metrics.queued_ms > 0

        # 2. A waiting batch request is shed when an interactive one is turned away.
        wait_for(lambda: client.workers()[0].load.num_running == 0, timeout=10, what="an idle worker")
        with Saturation(client, seeds=(50, 51)) as saturation:
            batch = queued_batch(seed=53)
            with pytest.raises(RejectedError):
                client.generate(prompt_ids(seed=54, length=10), max_tokens=2)
            batch.join(60)
            saturation.release()
    assert "result" not in outcome, "the batch request ran although an interactive one was turned away"
    assert "shed to make room for interactive requests" in str(outcome["error"])

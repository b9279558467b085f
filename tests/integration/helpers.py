"""Helpers for end-to-end tests against real local clusters."""

from __future__ import annotations

import json
import random
import ssl
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvplane import Client
from kvplane.errors import KvplaneError

BLOCK_SIZE = 16  # the engine's default, which these clusters use


def prompt_ids(seed: int, length: int, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Polls `predicate` until it returns a truthy value; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def cached_blocks(client, worker_id: str) -> int:
    for wc in client.cache():
        if wc.worker_id == worker_id:
            return sum(wc.blocks_by_tier.values())
    return 0


def https_context(cluster) -> ssl.SSLContext:
    """An SSL context that trusts a LocalCluster's CA: its HTTP API serves HTTPS."""
    return ssl.create_default_context(cafile=cluster.http_ca)


def scrape(url: str, cafile: str | None = None) -> dict[str, float]:
    """Prometheus samples as {'name{k="v",...}': value}, labels sorted, scope labels dropped
    (`cafile`: the CA an https URL is verified against, e.g. a LocalCluster's http_ca)."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    text = urllib.request.urlopen(url, timeout=5, context=context).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if not k.startswith("otel_scope"))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def metric_sum(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and all(w in k for w in wanted))


def agent_load(cluster, worker_id: str):
    """The agent's own view of its load (Agent.GetStatus, asked as the cluster's admin): its WorkerLoad message."""
    from kvplane import grpc_util
    from kvplane.v1 import agent_pb2, agent_pb2_grpc

    with grpc_util.channel(cluster.worker_endpoints[worker_id], cluster.credentials.admin) as channel:
        return agent_pb2_grpc.AgentStub(channel).GetStatus(agent_pb2.GetStatusRequest(), timeout=5).load


def busy_worker(cluster) -> str | None:
    """The worker whose engine is running a request right now (asked of each agent directly)."""
    import grpc

    for worker_id in cluster.worker_endpoints:
        try:
            if cluster.processes[worker_id].poll() is None and agent_load(cluster, worker_id).num_running > 0:
                return worker_id
        except grpc.RpcError:
            continue  # not serving (yet): not the one running the request
    return None


def assert_nothing_pinned(cluster, client, timeout: float = 15.0) -> None:
    """Once traffic stops: no worker holds blocks for a transfer or a request, by its own account
    (Agent.GetStatus) and by the control plane's (`kvplane cache`)."""
    seen: dict = {}

    def clean():
        seen.clear()  # a worker that did not answer last time may have been reaped since
        for worker_id in cluster.worker_endpoints:
            if cluster.processes[worker_id].poll() is None:
                try:
                    load = agent_load(cluster, worker_id)
                except grpc.RpcError:
                    # Killed a moment ago and not reaped yet (it is skipped once it has), or
                    # still starting: ask again.
                    seen[worker_id] = "not answering"
                    return False
                seen[worker_id] = dict(
                    pinned=load.num_pinned_blocks, used=load.num_used_blocks, running=load.num_running, waiting=load.num_waiting
                )
        seen["index"] = {c.worker_id: c.num_pinned_blocks for c in client.cache()}
        agents = [v for k, v in seen.items() if k != "index"]
        return all(not any(v.values()) for v in agents) and not any(seen["index"].values())

    deadline = time.monotonic() + timeout
    while not clean():
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout} s workers still hold blocks: {seen}")
        time.sleep(0.2)


def interrupted_stream(client, cluster, prompt, sig, max_tokens: int, **options):
    """Streams `prompt` (ignore_eos, `options` as the SDK takes them) and sends `sig` to its decode
    worker after the first tokens; returns (tokens, text, final metrics, the worker signalled).

    The cluster's agents must pace their steps (paced_sim_agents): a reference engine on a loaded
    2-core machine can generate every token before a starved caller reads its fifth, and then
    there is nothing left to interrupt."""
    tokens: list[int] = []
    text, final, victim = "", None, None
    for chunk in client.stream(prompt, max_tokens=max_tokens, ignore_eos=True, **options):
        tokens += chunk.token_ids
        text += chunk.text
        if victim is None and len(tokens) >= 5:
            victim = wait_for(lambda: busy_worker(cluster), timeout=5, interval=0.02, what="the worker running the request")
            cluster.kill(victim, sig)
        if chunk.finished:
            final = chunk.metrics
    assert victim is not None, f"the stream ended after {len(tokens)} tokens, before it could be interrupted"
    return tokens, text, final, victim


def paced_sim_agents(directory: Path, step_s: float = 0.01) -> tuple[str, ...]:
    """Agent flags for the simulated engine (no torch: an agent starts in about 2 s) with every
    engine step taking `step_s` wall seconds, whatever the machine's load: a 600-token stream
    lasts 6 s, long enough to find it running and interrupt it mid-stream. Its greedy tokens
    depend only on the sequence so far, so a stream moved to another worker goes on unchanged."""
    profile = Path(directory) / "paced_step_model.json"
    profile.write_text(json.dumps({"coefficients": [step_s, 1e-6, 0.0, 0.0, 0.0], "num_samples": 100, "mean_abs_pct_error": 0.0}))
    return ("--engine", "sim", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--sim-profile", str(profile))


class Traffic:
    """Greedy requests in a loop on their own thread; every output is compared with the reference."""

    def __init__(self, endpoint: str, prompts: list[list[int]], reference: list[tuple[int, ...]], max_tokens: int) -> None:
        self._endpoint, self._prompts, self._reference, self._max_tokens = endpoint, prompts, reference, max_tokens
        self.num_ok = 0
        self.wrong: list[int] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        with Client(self._endpoint, timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                k = i % len(self._prompts)
                try:
                    tokens = client.generate(self._prompts[k], max_tokens=self._max_tokens, ignore_eos=True).token_ids
                except KvplaneError as e:
                    self.failures.append(f"{type(e).__name__}: {e}")
                else:
                    self.num_ok += 1
                    if tokens != self._reference[k]:
                        self.wrong.append(k)
                i += 1

    def count(self, seconds: float) -> int:
        """Requests completed during the next `seconds`."""
        before = self.num_ok
        time.sleep(seconds)
        return self.num_ok - before

"""Threshold admission: when every worker is over its limits the request is rejected at once,
with a retry-after hint and a reason, through the SDK's typed exception; capacity coming back
admits requests again."""

from __future__ import annotations

import threading

import pytest

from kvplane import Client, RejectedError
from kvplane.apps.cluster import LocalCluster

from .helpers import metric_sum, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes


def test_overloaded_cluster_rejects_with_retry_after(tmp_path):
    limits = ("--max-running", "1", "--max-waiting", "1")
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, controlplane_args=limits, agent_args=("--max-tokens-limit", "1900"), log_dir=tmp_path
    ) as cluster:
        with Client(cluster.endpoint, timeout=120) as client:
            finished: list = []

            def run_long(seed: int):
                for chunk in client.stream(prompt_ids(seed=seed, length=20), max_tokens=1900, ignore_eos=True):
                    if chunk.finished:
                        finished.append(chunk)

            threads = [threading.Thread(target=run_long, args=(seed,)) for seed in (40, 42)]
            for thread in threads:
                thread.start()
            # The next load report shows both running: one over the limit of one.
            wait_for(lambda: client.workers()[0].load.num_running == 2, timeout=30, what="a load report")
            with pytest.raises(RejectedError) as info:
                client.generate(prompt_ids(seed=41, length=10), max_tokens=2)
            for thread in threads:
                thread.join(120)
            assert [c.finish_reason for c in finished] == ["length", "length"]
            wait_for(lambda: client.workers()[0].load.num_running == 0, timeout=5, what="the worker to be idle")
            after = client.generate(prompt_ids(seed=41, length=10), max_tokens=2)
    assert info.value.retry_after_s is not None and info.value.retry_after_s >= 1.0
    assert "running 2>1" in info.value.reason
    assert "rejected at admission" in str(info.value)
    assert len(after.token_ids) == 2


def test_batch_requests_wait_instead_of_being_rejected_and_are_shed_for_interactive(tmp_path):
    limits = ("--max-running", "1", "--max-waiting", "8")
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, controlplane_args=limits, agent_args=("--max-tokens-limit", "1900"), log_dir=tmp_path
    ) as cluster, Client(cluster.endpoint, timeout=120) as client:  # fmt: skip

        def run_long(seed: int) -> None:
            client.generate(prompt_ids(seed=seed, length=20), max_tokens=600, ignore_eos=True)

        def saturate() -> list[threading.Thread]:
            threads = [threading.Thread(target=run_long, args=(seed,)) for seed in (50, 51)]
            for thread in threads:
                thread.start()
            wait_for(lambda: client.workers()[0].load.num_running == 2, timeout=30, what="a saturated worker")
            return threads

        # 1. A batch request waits for room and then completes.
        threads = saturate()
        waited = client.generate(prompt_ids(seed=52, length=10), max_tokens=2, priority="batch")
        for thread in threads:
            thread.join(120)
        assert len(waited.token_ids) == 2 and waited.metrics.priority == "batch"
        assert waited.metrics.queued_ms > 0

        # 2. A waiting batch request is shed when an interactive one is turned away.
        wait_for(lambda: client.workers()[0].load.num_running == 0, timeout=10, what="an idle worker")
        threads = saturate()
        outcome: dict = {}

        def run_batch() -> None:
            try:
                outcome["result"] = client.generate(prompt_ids(seed=53, length=10), max_tokens=2, priority="batch")
            except RejectedError as e:
                outcome["error"] = e

        # A waiting batch request asks admission again every 50 ms; two more rejections mean it
        # has entered the queue and is waiting there.
        metrics_url = client.stats().metrics_url

        def rejections() -> float:
            return metric_sum(scrape(metrics_url), "kvplane_admission_decisions_total", kvplane_admission_decision="reject")

        before = rejections()
        batch = threading.Thread(target=run_batch)
        batch.start()
        wait_for(lambda: rejections() >= before + 2, timeout=30, what="the batch request to wait in the queue")
        with pytest.raises(RejectedError):
            client.generate(prompt_ids(seed=54, length=10), max_tokens=2)
        batch.join(60)
        for thread in threads:
            thread.join(120)
    assert "shed to make room for interactive requests" in str(outcome["error"])

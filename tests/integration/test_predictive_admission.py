"""Predictive admission end to end: a burst that would overload decode is rejected at arrival,
before any prefill work is spent; objectives set with the CLI change decisions on every replica."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import pytest

from kvplane import Client, RejectedError
from kvplane.cluster import LocalCluster
from kvplane.latency import StepTimeModel

from .helpers import BLOCK_SIZE, prompt_ids, wait_for

pytestmark = pytest.mark.cluster  # starts processes


def test_burst_that_would_overload_decode_is_rejected_before_prefill(tmp_path):
    with LocalCluster(num_prefill=0, num_decode=0, num_both=1, log_dir=tmp_path) as cluster:
        with Client(cluster.endpoint, timeout=120) as client:
            # The objective comes from a profile, a regression over timed steps on a loaded 2-core
            # machine, while the planner predicts with the worker's live model (the profile refitted
            # from the steps it runs since). When the two disagree so much that the live model
            # puts a lone request past the objective, or a burst of 8 under it, the scenario's
            # precondition does not hold: it is profiled again and replayed (three times at most).
            for attempt in range(3):
                outcome = _profiled_burst(client, seed=100 + 100 * attempt)
                if outcome is not None:
                    break
            assert outcome is not None, "three profiles disagreed with the live model too much to place the objective"
            _, prompts, outcomes = outcome
            admitted = [p for p, o in zip(prompts, outcomes) if not isinstance(o, RejectedError)]
            rejected = [(p, o) for p, o in zip(prompts, outcomes) if isinstance(o, RejectedError)]
            assert 1 <= len(admitted) < len(prompts) and rejected
            for _, error in rejected:
                assert error.reason.startswith("objective=tpot predicted_ms=")
                assert "target_ms=" in error.reason
                assert error.retry_after_s is not None and error.retry_after_s > 0
            for result in (o for o in outcomes if not isinstance(o, RejectedError)):
                assert result.metrics.predicted_tpot_ms > 0 and result.metrics.predicted_ttft_ms > 0
            # No prefill was spent on a rejected prompt: its blocks were never cached anywhere.
            client.set_config("admission.policy", "none")
            wait_for(
                lambda: all(client.route(p, max_tokens=1).cached_tokens > 0 for p in admitted),
                timeout=5,
                what="admitted prompts in the index",
            )
            assert all(client.route(p, max_tokens=1).cached_tokens == 0 for p, _ in rejected)


def _profiled_burst(client, seed: int):
    """Profiles the worker, sets a TPOT objective between the profile's step times of batches of
    2 and 5 (a few long requests fit, the rest would slow everyone past it) and sends 8 at once.
    (target_ms, prompts, outcomes), or None when the live model's predictions fall outside the
    profile's range (a lone probe rejected, or all 8 admitted under the objective)."""
    client.set_config("admission.policy", "none")
    # One run can clamp the per-sequence decode cost to 0: this needs a model that has one.
    for _ in range(3):
        profile = client.profile("both-0")
        model = StepTimeModel(tuple(profile.coefficients), profile.num_samples, profile.mean_abs_pct_error)
        per_sequence = model.decode_step_seconds(4, 0) - model.decode_step_seconds(3, 0)
        if per_sequence > 0:
            break
    assert per_sequence > 0, f"three profiles found no per-sequence decode cost: {profile}"
    context = 2 * (3 * BLOCK_SIZE + 100)
    target_ms = (model.decode_step_seconds(2, context) + model.decode_step_seconds(5, 2 * context)) / 2 * 1000
    client.set_config("objectives.*.interactive.tpot_ms", f"{target_ms:.6f}")
    client.set_config("objectives.*.interactive.ttft_ms", "60000")
    client.set_config("admission.policy", "predictive")
    # The profile reaches the planner with the worker's next load report: until then the worker
    # has no latency model and predictive admission takes every request.
    probe = prompt_ids(seed=seed - 1, length=BLOCK_SIZE)

    def predicted_or_rejected():
        try:
            return client.generate(probe, max_tokens=1).metrics.predicted_tpot_ms > 0
        except RejectedError as e:
            return e  # predicted, and already past the objective alone

    arrived = wait_for(predicted_or_rejected, timeout=30, what="the worker's latency model in the control plane")
    if isinstance(arrived, RejectedError):
        return None
    wait_for(lambda: client.workers()[0].load.num_running == 0, timeout=10, what="an idle worker")
    prompts = [prompt_ids(seed=seed + i, length=3 * BLOCK_SIZE) for i in range(8)]

    def send(prompt):
        try:
            return client.generate(prompt, max_tokens=200, ignore_eos=True)
        except RejectedError as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        outcomes = list(pool.map(send, prompts))
    if not any(isinstance(o, RejectedError) for o in outcomes):
        return None
    return target_ms, prompts, outcomes


def test_objective_changed_with_the_cli_applies_on_every_replica(etcd_factory, tmp_path):
    etcd = etcd_factory()
    with LocalCluster(num_prefill=0, num_decode=0, num_both=1, store=etcd.url, log_dir=tmp_path) as cluster:
        second = cluster.add_controlplane()
        with Client(cluster.endpoint, timeout=60) as first_client, Client(second, timeout=60) as second_client:
            first_client.profile("both-0")  # a latency model, so admission can predict
            prompt = prompt_ids(seed=120, length=40)

            def kvplane(*args: str) -> str:
                result = subprocess.run(
                    [sys.executable, "-m", "kvplane", *args, "--endpoint", cluster.endpoint],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert result.returncode == 0, result.stderr
                return result.stdout

            kvplane("config", "set", "admission.policy", "predictive")
            kvplane("config", "set", "objectives.*.interactive.ttft_ms", "0.001")

            def rejected_everywhere() -> bool:
                for client in (first_client, second_client):
                    try:
                        client.generate(prompt, max_tokens=2)
                        return False
                    except RejectedError as e:
                        assert e.reason.startswith("objective=ttft")
                return True

            wait_for(rejected_everywhere, timeout=1.0, interval=0.05, what="both replicas to apply the objective")
            kvplane("config", "set", "objectives.*.interactive.ttft_ms", "600000")
            wait_for(
                lambda: all(len(c.generate(prompt, max_tokens=2).token_ids) == 2 for c in (first_client, second_client)),
                timeout=1.0, interval=0.05, what="both replicas to admit again",
            )  # fmt: skip
            assert second_client.config()["objectives.*.interactive.ttft_ms"] == "600000"

"""Predictive admission end to end: a burst that would overload decode is rejected at arrival,
before any prefill work is spent; objectives set with the CLI change decisions on every replica.
Nothing here depends on the machine's speed: the burst runs on a sim worker whose step time is an
exact linear model, held still (SIGSTOP) while its requests are decided."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys

import pytest

from kvplane import Client, RejectedError
from kvplane.apps.cluster import LocalCluster
from kvplane.grpc_util import channel
from kvplane.latency import StepTimeModel
from kvplane.v1 import client_pb2, client_pb2_grpc, common_pb2

from .helpers import BLOCK_SIZE, metric_sum, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes


# The sim worker's step time is this linear model exactly (a `kvplane profile --json` file), so the
# model its agent fits from the steps it runs is this one, whatever the machine's speed: a refit
# between reading the predictions and the burst changes nothing. c0 + c3 x batch: 2 ms a step and
# 2 ms per decoding sequence (a TPOT of 4 ms alone, 18 ms among eight); tiny prefill and context terms.
STEP_MODEL = {"coefficients": [0.002, 2e-6, 1e-9, 0.002, 1e-7], "num_samples": 100, "mean_abs_pct_error": 0.0}
WORKER = "both-0"


def test_burst_that_would_overload_decode_is_rejected_before_prefill(tmp_path):
    profile = tmp_path / "step_model.json"
    profile.write_text(json.dumps(STEP_MODEL))
    agent_args = ("--engine", "sim", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--sim-profile", str(profile))
    # A stopped worker stays in routing (its lease outlives the burst; silence is judged later).
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, agent_args=agent_args, log_dir=tmp_path,
        controlplane_args=("--silent-after-s", "60"),
    ) as cluster:  # fmt: skip
        with Client(cluster.endpoint, timeout=120) as client:
            stub = client_pb2_grpc.KvplaneStub(channel(cluster.endpoint, client.credentials))
            target_ms, prompts, outcomes = _burst_against_its_own_predictions(cluster, client, stub, seed=100)
            admitted = [p for p, o in zip(prompts, outcomes) if not isinstance(o, RejectedError)]
            rejected = [(p, o) for p, o in zip(prompts, outcomes) if isinstance(o, RejectedError)]
            assert 1 <= len(admitted) < len(prompts) and rejected
            # Each request saw the ones admitted before it, so once one is rejected the rest are.
            assert [isinstance(o, RejectedError) for o in outcomes] == [False] * len(admitted) + [True] * len(rejected)
            for _, error in rejected:
                assert error.reason.startswith("objective=tpot predicted_ms=")
                fields = dict(f.split("=", 1) for f in error.reason.split())
                assert float(fields["target_ms"]) == pytest.approx(target_ms, rel=1e-3)
                assert float(fields["predicted_ms"]) >= float(fields["target_ms"])  # both rounded to 4 digits
                assert error.retry_after_s is not None and error.retry_after_s > 0
            for result in (o for o in outcomes if not isinstance(o, RejectedError)):
                assert len(result.token_ids) == BURST_MAX_TOKENS
                # Predicted (a calibrated TTFT may be 0: measured TTFTs below the model's clamp it there).
                assert result.metrics.predicted_tpot_ms > 0 and result.metrics.predicted_ttft_ms >= 0
            # No prefill was spent on a rejected prompt: its blocks were never cached anywhere.
            client.set_config("admission.policy", "none")
            wait_for(
                lambda: all(client.route(p, max_tokens=1).cached_tokens > 0 for p in admitted),
                timeout=5,
                what="admitted prompts in the index",
            )
            assert all(client.route(p, max_tokens=1).cached_tokens == 0 for p, _ in rejected)


BURST, BURST_PROMPT_TOKENS, BURST_MAX_TOKENS = 8, 3 * BLOCK_SIZE, 200


def _burst_against_its_own_predictions(cluster, client, stub, seed: int):
    """Sets a TPOT objective halfway between the planner's predictions for the first and the last
    of 8 requests arriving while the earlier ones are admitted (a few fit, the rest would slow
    everyone past it) and sends 8. Returns (target_ms, prompts, outcomes).

    The worker is stopped (SIGSTOP) from the reading of the predictions until the last request is
    decided: no step runs, no request ends, no load report or calibration moves, so every request
    meets the state the predictions were read in, on any machine."""
    client.set_config("admission.policy", "none")
    profile = client.profile(WORKER, max_prompt_tokens=256, max_batch=4)  # the worker's latency model
    model = StepTimeModel(tuple(profile.coefficients), profile.num_samples, profile.mean_abs_pct_error)
    assert model.decode_step_seconds(4, 0) > model.decode_step_seconds(3, 0), f"no per-sequence decode cost: {profile}"
    client.set_config("objectives.*.interactive.tpot_ms", "60000")
    client.set_config("objectives.*.interactive.ttft_ms", "60000")
    client.set_config("admission.policy", "predictive")
    # The model reaches the planner with the worker's next load report: until then there is no
    # prediction and predictive admission takes every request.
    probe = prompt_ids(seed=seed - 1, length=BLOCK_SIZE)
    wait_for(
        lambda: client.generate(probe, max_tokens=1).metrics.predicted_tpot_ms > 0,
        timeout=30, what="the worker's latency model in the control plane",
    )  # fmt: skip
    wait_for(lambda: client.workers()[0].load.num_running == 0, timeout=10, what="an idle worker")
    metrics_url = client.stats().metrics_url
    prompts = [prompt_ids(seed=seed + i, length=BURST_PROMPT_TOKENS) for i in range(BURST)]

    def send(prompt):
        try:
            return client.generate(prompt, max_tokens=BURST_MAX_TOKENS, ignore_eos=True)
        except RejectedError as e:
            return e

    def decisions() -> float:
        return metric_sum(scrape(metrics_url), "kvplane_admission_decisions_total")

    pool = concurrent.futures.ThreadPoolExecutor(BURST)
    futures = []
    cluster.kill(WORKER, signal.SIGSTOP)
    try:
        # What the planner predicts for the burst: the same shape placed one after another in
        # lookaside mode (each charged, as the burst's requests will be) and cancelled.
        placements = []
        for i in range(BURST):
            request = client_pb2.GenerateRequest(
                token_ids=client_pb2.TokenIds(ids=prompt_ids(seed=seed + 50 + i, length=BURST_PROMPT_TOKENS)),
                sampling=common_pb2.SamplingParams(max_tokens=BURST_MAX_TOKENS, ignore_eos=True),
                lookaside=True,
            )  # fmt: skip
            placements.append(stub.Route(request, timeout=30).placement)
        for placement in placements:
            stub.Report(client_pb2.ReportRequest(placement_id=placement.placement_id, event=client_pb2.ReportRequest.CANCELLED), timeout=10)
        predicted = [p.metrics.predicted_tpot_ms for p in placements]
        assert predicted == sorted(predicted) and predicted[-1] > predicted[0], f"each request should slow the batch: {predicted}"
        target_ms = round((predicted[0] + predicted[-1]) / 2, 3)
        client.set_config("objectives.*.interactive.tpot_ms", f"{target_ms:.3f}")
        # One at a time, each once the one before it is decided: admitted ones wait for the
        # stopped worker, charged, as the lookaside placements were.
        for prompt in prompts:
            before = decisions()
            futures.append(pool.submit(send, prompt))
            wait_for(lambda: decisions() > before, timeout=30, interval=0.02, what="the control plane's decision")  # noqa: B023
    finally:
        cluster.kill(WORKER, signal.SIGCONT)
        pool.shutdown(wait=False)
    return target_ms, prompts, [f.result(timeout=120) for f in futures]


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

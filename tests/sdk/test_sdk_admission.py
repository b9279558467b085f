"""What predictive admission adds to the SDK: priorities, retrying rejections on request, config and profiles."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

import kvplane
from kvplane import AsyncClient, Client
from kvplane.client import ProfileResult, build_request, retry_wait
from tests.sdk.scripted_server import FAST_RETRY_AFTER_MS, ScriptedServer

HINT_S = FAST_RETRY_AFTER_MS / 1000


def _gaps(server: ScriptedServer) -> list[float]:
    times = server.servicer.arrivals
    return [b - a for a, b in zip(times, times[1:])]


# -- retry_wait: the decision alone ---------------------------------------------------------------


def _rejection(retry_after_s: float | None) -> kvplane.RejectedError:
    return kvplane.RejectedError("overloaded", retry_after_s=retry_after_s, reason="ttft_slo")


def test_retry_wait_follows_the_hint_while_retries_and_time_remain() -> None:
    assert retry_wait(_rejection(0.25), attempt=0, reject_retries=2, remaining_s=None) == 0.25
    assert retry_wait(_rejection(0.25), attempt=1, reject_retries=2, remaining_s=1.0) == 0.25
    assert retry_wait(_rejection(0.0), attempt=0, reject_retries=1, remaining_s=None) == 0.0


@pytest.mark.parametrize(
    ("hint", "attempt", "retries", "remaining"),
    [(0.25, 0, 0, None), (0.25, 2, 2, None), (None, 0, 3, None), (0.25, 0, 3, 0.25), (2.0, 0, 3, 1.0)],
    ids=["not-asked", "used-up", "no-hint", "hint-equals-time-left", "hint-exceeds-time-left"],
)
def test_retry_wait_gives_up(hint: float | None, attempt: int, retries: int, remaining: float | None) -> None:
    assert retry_wait(_rejection(hint), attempt=attempt, reject_retries=retries, remaining_s=remaining) is None


# -- blocking client ------------------------------------------------------------------------------


def test_no_retry_unless_asked(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(kvplane.RejectedError) as info:
        client.generate("reject-then-ok:1:a")
    assert (info.value.retry_after_s, info.value.reason) == (HINT_S, "tpot_slo")
    assert server.servicer.seen["reject-then-ok:1:a"] == 1


def test_retries_exactly_n_times_after_the_hint_then_succeeds(server: ScriptedServer) -> None:
    with Client(server.endpoint, reject_retries=2) as client:
        result = client.generate("reject-then-ok:2:b", max_tokens=3)
    assert result.text == "rej"
    assert server.servicer.seen["reject-then-ok:2:b"] == 3
    assert all(gap >= HINT_S for gap in _gaps(server))


def test_retries_run_out_and_the_last_rejection_is_raised(server: ScriptedServer) -> None:
    with Client(server.endpoint, reject_retries=2) as client, pytest.raises(kvplane.RejectedError):
        client.generate("reject-fast")
    assert server.servicer.seen["reject-fast"] == 3
    assert len(_gaps(server)) == 2 and all(gap >= HINT_S for gap in _gaps(server))


def test_per_call_override_beats_the_constructor(server: ScriptedServer) -> None:
    with Client(server.endpoint, reject_retries=5) as client:
        with pytest.raises(kvplane.RejectedError):
            client.generate("reject-fast", reject_retries=1)
        assert server.servicer.seen["reject-fast"] == 2
        with pytest.raises(kvplane.RejectedError):
            client.route("reject-fast", reject_retries=0)
        assert server.servicer.seen["reject-fast"] == 3
    with Client(server.endpoint) as client:
        assert client.generate("reject-then-ok:1:c", max_tokens=6, reject_retries=1).text == "reject"


def test_a_hint_longer_than_the_time_left_fails_at_once(server: ScriptedServer) -> None:
    started = time.monotonic()
    with Client(server.endpoint, timeout=1.0, reject_retries=3) as client, pytest.raises(kvplane.RejectedError) as info:
        client.generate("reject")  # retry-after 1.5 s
    assert info.value.retry_after_s == 1.5
    assert server.servicer.seen["reject"] == 1
    assert time.monotonic() - started < 1.0


def test_stream_and_route_retry_too(server: ScriptedServer) -> None:
    with Client(server.endpoint, reject_retries=1) as client:
        chunks = list(client.stream("reject-then-ok:1:d", max_tokens=2))
        assert [c.text for c in chunks] == ["re", ""]
        assert client.route("reject-then-ok:1:e").decode_worker == "decode-0"
    assert server.servicer.seen["reject-then-ok:1:d"] == 2 and server.servicer.seen["reject-then-ok:1:e"] == 2


def test_bad_reject_retries_are_refused(server: ScriptedServer) -> None:
    with pytest.raises(ValueError, match="reject_retries must be between 0 and"):
        Client(server.endpoint, reject_retries=-1)
    with Client(server.endpoint) as client, pytest.raises(TypeError, match="reject_retries must be an int"):
        client.generate("x", reject_retries=1.5)  # type: ignore[arg-type]
    assert server.servicer.requests == []


def test_priority_goes_on_the_wire(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        client.generate("a", max_tokens=1)
        client.generate("b", max_tokens=1, priority="batch")
        list(client.stream("c", max_tokens=1, priority="batch"))
        client.route("d", priority="interactive")
    assert [r.priority for r in server.servicer.requests] == ["interactive", "batch", "batch", "interactive"]


def test_unknown_priority_is_refused_before_sending(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(ValueError, match="priority must be one of 'interactive', 'batch', got 'urgent'"):
        client.stream("x", priority="urgent")
    assert server.servicer.requests == []
    with pytest.raises(ValueError, match="priority must be one of"):
        build_request("x", priority="")


def test_metrics_carry_predictions_and_priority(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        m = client.generate("hi").metrics
    assert (m.predicted_ttft_ms, m.predicted_tpot_ms, m.priority, m.queued_ms) == (11.0, 2.5, "interactive", 0.0)


def test_config_get_and_set(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        assert client.config() == {"admission.policy": "threshold"}
        assert client.set_config("objectives.builtin-tiny.interactive.ttft_ms", "250") == {
            "admission.policy": "threshold", "objectives.builtin-tiny.interactive.ttft_ms": "250",
        }  # fmt: skip
        assert client.set_config("admission.policy", "predictive")["admission.policy"] == "predictive"
        assert client.set_config("objectives.builtin-tiny.interactive.ttft_ms", "") == {"admission.policy": "predictive"}
        with pytest.raises(kvplane.InvalidArgumentError, match="unknown config key 'bogus'"):
            client.set_config("bogus", "1")


def test_profile(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        result = client.profile("prefill-0", max_prompt_tokens=512, max_batch=8)
        assert result == ProfileResult(
            worker_id="prefill-0", coefficients=(0.002, 1.5e-5, 1e-9, 4e-4, 2e-7), num_samples=48,
            mean_abs_pct_error=pytest.approx(0.042),
        )  # fmt: skip
        request = server.servicer.profile_requests[-1]
        assert (request.worker_id, request.max_prompt_tokens, request.max_batch) == ("prefill-0", 512, 8)
        client.profile("decode-0")
        assert (server.servicer.profile_requests[-1].max_prompt_tokens, server.servicer.profile_requests[-1].max_batch) == (0, 0)
        with pytest.raises(kvplane.NotFoundError, match="no worker 'nope'"):
            client.profile("nope")
        with pytest.raises(ValueError, match="max_batch must be between 0 and"):
            client.profile("decode-0", max_batch=-1)


# -- asyncio client -------------------------------------------------------------------------------


def test_async_retries_priority_config_and_profile(server: ScriptedServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.endpoint) as client:
            with pytest.raises(kvplane.RejectedError):
                await client.generate("reject-then-ok:1:f")  # not asked: no retry
            assert server.servicer.seen["reject-then-ok:1:f"] == 1
            with pytest.raises(kvplane.RejectedError):
                await client.generate("reject-fast", reject_retries=2)
            assert server.servicer.seen["reject-fast"] == 3
            result = await client.generate("reject-then-ok:2:g", max_tokens=2, reject_retries=2, priority="batch")
            assert result.text == "re" and server.servicer.seen["reject-then-ok:2:g"] == 3
            assert server.servicer.requests[-1].priority == "batch"
            chunks = [c async for c in client.stream("reject-then-ok:1:h", max_tokens=1, reject_retries=1)]
            assert chunks[-1].finished
            assert (await client.route("reject-then-ok:1:i", reject_retries=1)).decode_worker == "decode-0"
            with pytest.raises(ValueError, match="priority must be one of"):
                client.stream("x", priority="low")
            assert (await client.set_config("admission.policy", "none")) == {"admission.policy": "none"}
            assert (await client.config()) == {"admission.policy": "none"}
            profile = await client.profile("decode-0", max_batch=4)
            assert (profile.worker_id, profile.num_samples, len(profile.coefficients)) == ("decode-0", 48, 5)
            with pytest.raises(kvplane.NotFoundError):
                await client.profile("nope")
        gaps = _gaps(server)
        assert sum(gap >= HINT_S for gap in gaps) >= 5  # every retry waited for the hint

    asyncio.run(scenario())


def test_async_constructor_default_retries(server: ScriptedServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.endpoint, reject_retries=1) as client:
            assert (await client.generate("reject-then-ok:1:j", max_tokens=1)).text == "r"
        with pytest.raises(ValueError, match="reject_retries"):
            AsyncClient(server.endpoint, reject_retries=-2)

    asyncio.run(scenario())


def test_rejection_code_is_resource_exhausted(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(kvplane.RejectedError) as info:
        client.route("reject-fast")
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details == "predicted TPOT 80 ms > objective 50 ms"

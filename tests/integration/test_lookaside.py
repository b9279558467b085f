"""Lookaside mode: the SDK gets a placement and a ticket from the control plane, streams from the
decode agent itself and reports back. The same admission, accounting and metrics as relay mode
(a placement is charged until it is reported or expires), and a decode worker that dies or
stalls mid-stream is handled as relay mode handles it: the request moves and the stream goes on
with no gap and no repeat."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest

from kvplane import AsyncClient, Client
from kvplane.apps.cluster import LocalCluster
from kvplane.grpc_util import channel
from kvplane.v1 import client_pb2, client_pb2_grpc, common_pb2

from .helpers import assert_nothing_pinned, busy_worker, interrupted_stream, metric_sum, paced_sim_agents, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes

MAX_TOKENS = 600  # 6 s of paced steps (paced_sim_agents): long enough to interrupt mid-stream
PLACEMENTS = "kvplane_lookaside_placements_total"
OUTCOME = "kvplane_lookaside_outcome"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("lookaside")
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, log_dir=log_dir, agent_args=paced_sim_agents(log_dir),
        controlplane_args=("--token-timeout", "2", "--silent-after-s", "1.5"),
    ) as cluster:  # fmt: skip
        yield cluster


def test_lookaside_streams_what_relay_streams_with_the_same_metrics(cluster):
    prompt = prompt_ids(seed=80, length=40)
    with Client(cluster.endpoint, timeout=120) as client:
        relayed = client.generate(prompt, max_tokens=24, ignore_eos=True)
        metrics_url = client.stats().metrics_url
        before = scrape(metrics_url)
        chunks = list(client.stream(prompt, max_tokens=24, ignore_eos=True, lookaside=True))
        wait_for(lambda: metric_sum(scrape(metrics_url), PLACEMENTS, **{OUTCOME: "finished"}) > 0, timeout=10, what="the finished report")
        after = scrape(metrics_url)
        stats = {s.worker_id: s.num_requests for s in client.stats().workers}
    assert [t for c in chunks for t in c.token_ids] == list(relayed.token_ids)
    assert "".join(c.text for c in chunks) == relayed.text
    m = chunks[-1].metrics
    assert chunks[-1].finished and m.decode_worker in cluster.worker_endpoints
    assert m.prompt_tokens == len(prompt) and m.cached_tokens >= 32  # the relayed run left the prefix cached
    assert m.route_reason and m.ttft_ms > 0 and m.request_id == chunks[-1].request_id
    assert metric_sum(after, PLACEMENTS, **{OUTCOME: "finished"}) - metric_sum(before, PLACEMENTS, **{OUTCOME: "finished"}) == 1
    admitted = "kvplane_admission_decisions_total"
    assert (
        metric_sum(after, admitted, kvplane_admission_decision="admit") - metric_sum(before, admitted, kvplane_admission_decision="admit")
        == 1
    )
    tokens = "kvplane_output_tokens_total"
    assert metric_sum(after, tokens) - metric_sum(before, tokens) == 24
    assert sum(stats.values()) >= 2  # both requests are in the replica's stats window


def test_a_lookaside_request_prefilled_on_another_worker_hides_the_prefills_end_and_reports_it(cluster):
    """The SDK asks the decode agent for the remote prefill's end and reports it (PREFILL_DONE);
    its caller sees tokens and the end only."""
    prompt = prompt_ids(seed=84, length=40)
    with Client(cluster.endpoint, timeout=120) as client:
        chunks = list(client.stream(prompt, max_tokens=8, ignore_eos=True, lookaside=True, disagg="always"))
    assert chunks[-1].finished and chunks[-1].metrics.disaggregated
    assert all(c.token_ids or c.finished for c in chunks) and sum(len(c.token_ids) for c in chunks) == 8


def test_the_async_client_streams_in_lookaside_mode_and_a_caller_that_stops_early_is_reported(cluster):
    prompt = prompt_ids(seed=81, length=40)

    async def run():
        async with AsyncClient(cluster.endpoint, timeout=120) as client:
            whole = await client.generate(prompt, max_tokens=12, ignore_eos=True, lookaside=True)
            metrics_url = (await client.stats()).metrics_url
            before = metric_sum(scrape(metrics_url), PLACEMENTS, **{OUTCOME: "cancelled"})
            got = 0
            stream = client.stream(prompt, max_tokens=MAX_TOKENS, ignore_eos=True, lookaside=True)
            async for chunk in stream:
                got += len(chunk.token_ids)
                if got >= 3:
                    break
            await stream.aclose()
            # Reported by aclose() itself, while the client is open: nothing is left to a
            # finalizer that may run after the channel closed (the scrape blocks the event loop).
            after = metric_sum(scrape(metrics_url), PLACEMENTS, **{OUTCOME: "cancelled"})
            return whole, before, after

    whole, before, after = asyncio.run(run())
    assert len(whole.token_ids) == 12 and whole.metrics.decode_worker
    assert after == before + 1
    with Client(cluster.endpoint, timeout=60) as client:
        assert_nothing_pinned(cluster, client)


def test_a_killed_decode_worker_mid_stream_migrates_in_lookaside_mode(cluster):
    prompt = prompt_ids(seed=82, length=40)
    with Client(cluster.endpoint, timeout=120) as client:
        reference = client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
        metrics_url = client.stats().metrics_url
        before = metric_sum(scrape(metrics_url), "kvplane_request_migrations_total", kvplane_migration_reason="worker_failed")
        tokens, text, metrics, victim = interrupted_stream(client, cluster, prompt, signal.SIGKILL, MAX_TOKENS, lookaside=True)
        after = metric_sum(scrape(metrics_url), "kvplane_request_migrations_total", kvplane_migration_reason="worker_failed")
    assert tuple(tokens) == reference.token_ids and text == reference.text
    assert metrics.num_migrations == 1 and metrics.decode_worker != victim
    assert after - before == 1
    cluster.restart_agent(victim, timeout=90)
    with Client(cluster.endpoint, timeout=60) as client:
        assert_nothing_pinned(cluster, client)


def test_a_stopped_decode_worker_stalls_the_lookaside_stream_which_moves(cluster):
    prompt = prompt_ids(seed=83, length=40)
    with Client(cluster.endpoint, timeout=120) as client:
        reference = client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
        # The stream needs a worker to move to. On a loaded machine a request here (the reference,
        # an earlier test's) can miss the module's 2 s token timeout, and its worker is then out of
        # routing for --stalled-for-s: wait until this replica routes to both again.
        wait_for(lambda: not any(w.out_of_routing for w in client.workers()), timeout=45, what="both workers back in routing")
        tokens, text, metrics, victim = interrupted_stream(client, cluster, prompt, signal.SIGSTOP, MAX_TOKENS, lookaside=True)
        try:
            assert tuple(tokens) == reference.token_ids and text == reference.text
            assert metrics.num_migrations == 1 and metrics.decode_worker != victim
        finally:
            cluster.kill(victim, signal.SIGCONT)
        assert_nothing_pinned(cluster, client)


def test_a_stopped_worker_is_shown_out_of_routing_until_it_reports_again(cluster):
    """ListWorkers says why the replica routes a worker nothing: here its load reports stopped
    (--silent-after-s 1.5 in this module) while its lease (10 s) still holds."""
    victim = sorted(cluster.worker_endpoints)[0]
    with Client(cluster.endpoint, timeout=60) as client:
        wait_for(lambda: not any(w.out_of_routing for w in client.workers()), timeout=45, what="every worker in routing")
        cluster.kill(victim, signal.SIGSTOP)
        try:
            why = wait_for(
                lambda: next((w.out_of_routing for w in client.workers() if w.worker_id == victim), None),
                timeout=8, interval=0.1, what=f"{victim} out of routing",
            )  # fmt: skip
            assert why.startswith("no load report for"), why
        finally:
            cluster.kill(victim, signal.SIGCONT)
        wait_for(lambda: not any(w.out_of_routing for w in client.workers()), timeout=10, what=f"{victim} back in routing")


def _place(stub, seed: int) -> client_pb2.Placement:
    request = client_pb2.GenerateRequest(
        token_ids=client_pb2.TokenIds(ids=prompt_ids(seed=seed, length=20)),
        sampling=common_pb2.SamplingParams(max_tokens=4),
        lookaside=True,
    )
    return stub.Route(request, timeout=30).placement


def test_reports_on_the_stream_are_answered_in_order_and_an_error_does_not_end_it(cluster):
    """ReportStream: an answer per report, in order; a report's error is its answer's code."""
    with Client(cluster.endpoint, timeout=60) as client:
        stub = client_pb2_grpc.KvplaneStub(channel(cluster.endpoint, client.credentials))
        first, second = _place(stub, 90), _place(stub, 91)
        metrics_url = client.stats().metrics_url
        before = metric_sum(scrape(metrics_url), PLACEMENTS, **{OUTCOME: "cancelled"})
        report = client_pb2.ReportRequest
        sent = [
            (first.placement_id, report.FIRST_TOKEN, grpc.StatusCode.OK),
            (first.placement_id, report.PREFILL_DONE, grpc.StatusCode.OK),  # prefilled where it decodes: nothing to release
            ("no-such-placement", report.FINISHED, grpc.StatusCode.NOT_FOUND),
            (second.placement_id, report.FAILED, grpc.StatusCode.FAILED_PRECONDITION),  # needs Report: its answer is the next placement
            (first.placement_id, report.EVENT_UNSPECIFIED, grpc.StatusCode.INVALID_ARGUMENT),
            (first.placement_id, report.CANCELLED, grpc.StatusCode.OK),
            (second.placement_id, report.CANCELLED, grpc.StatusCode.OK),
            (first.placement_id, report.CANCELLED, grpc.StatusCode.NOT_FOUND),  # it ended
        ]
        answers = list(stub.ReportStream(iter(report(placement_id=p, event=e) for p, e, _ in sent), timeout=30))
        assert [(a.placement_id, a.code) for a in answers] == [(p, code.value[0]) for p, _, code in sent]
        assert "route the request again" in answers[2].message and "send FAILED with Report" in answers[3].message
        assert metric_sum(scrape(metrics_url), PLACEMENTS, **{OUTCOME: "cancelled"}) == before + 2
        assert_nothing_pinned(cluster, client)


def test_a_placement_is_charged_until_reported_or_expired(tmp_path):
    """One worker that takes at most one waiting request: two outstanding placements fill it, a
    third is rejected; a report (or the expiry of a silent caller's placement) frees the room."""
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, log_dir=tmp_path,
        controlplane_args=("--max-running", "1", "--max-waiting", "1", "--ticket-ttl", "1", "--first-token-timeout", "1"),
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        stub = client_pb2_grpc.KvplaneStub(channel(cluster.endpoint, client.credentials))
        first, second = _place(stub, 1), _place(stub, 2)
        with pytest.raises(grpc.RpcError) as info:
            _place(stub, 3)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
        stub.Report(client_pb2.ReportRequest(placement_id=first.placement_id, event=client_pb2.ReportRequest.CANCELLED), timeout=10)
        third = _place(stub, 4)  # the cancel released the first one's charge
        with pytest.raises(grpc.RpcError):
            _place(stub, 5)
        # Nobody reports the second and third: they expire (ticket lifetime + first-token timeout).
        time.sleep(2.5)
        _place(stub, 6)
        metrics_url = client.stats().metrics_url
        assert metric_sum(scrape(metrics_url), PLACEMENTS, **{OUTCOME: "expired"}) == 2
        del second, third
        # The SDK's whole loop, repeated beside the outstanding sixth placement: each request's end
        # is reported before the next is placed, so none finds the worker full.
        for seed in range(4):
            result = client.generate(prompt_ids(seed=10 + seed, length=20), max_tokens=4, lookaside=True)
            assert len(result.token_ids) == 4


def test_when_the_placing_replica_dies_with_the_worker_the_request_is_placed_again_on_the_other(etcd_factory, tmp_path):
    """The decode worker and the replica that placed the request die mid-stream: the failure
    report cannot reach that replica, the other one does not know the placement (NOT_FOUND), so
    the SDK places the request again there after the tokens it has, and the stream goes on with
    no gap and no repeat."""
    etcd = etcd_factory()
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, store=etcd.url, num_controlplanes=2, log_dir=tmp_path,
        controlplane_args=("--lease-ttl", "6"), agent_args=paced_sim_agents(tmp_path),
    ) as cluster, Client(cluster.endpoint, timeout=120) as client:  # fmt: skip
        prompt = prompt_ids(seed=84, length=40)
        reference = client.generate(prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
        # The replica that answered last places the next request (replica 0 as a rule; the other
        # when 0 was slow to answer on a loaded machine): that one dies with the worker.
        by_endpoint = {endpoint: name for name, endpoint in cluster.controlplane_endpoints.items()}
        placing = by_endpoint[client.endpoints[client._preferred]]
        survivor_name = next(name for name in by_endpoint.values() if name != placing)
        tokens: list[int] = []
        text, final, victim = "", None, None
        for chunk in client.stream(prompt, max_tokens=MAX_TOKENS, ignore_eos=True, lookaside=True):
            tokens += chunk.token_ids
            text += chunk.text
            if victim is None and len(tokens) >= 5:
                victim = wait_for(lambda: busy_worker(cluster), timeout=5, interval=0.02, what="the busy worker")
                cluster.kill(placing, signal.SIGKILL)
                cluster.kill(victim, signal.SIGKILL)
            if chunk.finished:
                final = chunk.metrics
        assert tuple(tokens) == reference.token_ids and text == reference.text
        assert final.decode_worker != victim
        # The survivor placed the rest (admitted there: it never saw the first placement) and got its end.
        with Client(cluster.controlplane_endpoints[survivor_name], timeout=30) as survivor:
            samples = scrape(survivor.stats().metrics_url)
        assert metric_sum(samples, PLACEMENTS, **{OUTCOME: "finished"}) == 1
        assert metric_sum(samples, "kvplane_admission_decisions_total", kvplane_admission_decision="admit") >= 1

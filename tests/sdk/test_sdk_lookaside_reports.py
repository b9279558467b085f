"""Where the SDK's lookaside reports go: the asyncio client sends them on one ReportStream per
replica (answers matched to reports in order, any number in flight), falls back to Report calls
on a control plane without the stream, and sends the end again as a call when the stream breaks;
the blocking client makes a call per report. Against the scripted server (real gRPC, mutual TLS),
which places lookaside requests on its own echoing Agent service."""

from __future__ import annotations

import asyncio

from kvplane import AsyncClient, Client
from kvplane.call_stream import CallStream
from kvplane.client.lookaside import REPORT_TIMEOUT_S
from kvplane.grpc_util import aio_channel
from kvplane.v1 import client_pb2, client_pb2_grpc
from tests.sdk.scripted_server import ScriptedServer

FIRST, FINISHED = client_pb2.ReportRequest.FIRST_TOKEN, client_pb2.ReportRequest.FINISHED
PREFILL_DONE = client_pb2.ReportRequest.PREFILL_DONE


async def _generate(server: ScriptedServer, prompts: list[str]) -> list[str]:
    async with AsyncClient(server.endpoint) as client:
        results = await asyncio.gather(*(client.generate(p, max_tokens=8, lookaside=True) for p in prompts))
    return [r.text for r in results]


def test_the_async_client_reports_on_one_stream(server: ScriptedServer) -> None:
    prompts = [f"req{i}" for i in range(6)]
    assert asyncio.run(_generate(server, prompts)) == prompts
    reports = server.servicer.reports
    assert sorted(reports) == sorted([("stream", FIRST)] * 6 + [("stream", FINISHED)] * 6)
    assert server.servicer.num_report_streams == 1  # six requests in flight together, one stream


def test_without_the_stream_the_async_client_reports_by_calls(server: ScriptedServer) -> None:
    server.servicer.report_stream = False  # an older control plane: UNIMPLEMENTED
    assert asyncio.run(_generate(server, ["abc", "defg"])) == ["abc", "defg"]
    assert sorted(server.servicer.reports) == sorted([("call", FIRST)] * 2 + [("call", FINISHED)] * 2)


def test_an_end_the_broken_stream_did_not_answer_is_sent_again_as_a_call(server: ScriptedServer) -> None:
    server.servicer.break_stream_on = FINISHED
    assert asyncio.run(_generate(server, ["abcdef"])) == ["abcdef"]
    assert server.servicer.reports == [("stream", FIRST), ("call", FINISHED)]


def test_the_blocking_client_reports_by_calls_and_loses_no_first_token_report(server: ScriptedServer) -> None:
    """Each first-token report is a call in the background, held until answered (grpc cancels a
    call whose future is collected: it lost about 4 in 10 of them) and waited for at close."""
    with Client(server.endpoint) as client:
        for i in range(10):
            assert client.generate(f"abc{i}", max_tokens=8, lookaside=True).text == f"abc{i}"
    assert sorted(server.servicer.reports) == [("call", FIRST)] * 10 + [("call", FINISHED)] * 10


def test_many_reports_in_flight_on_one_stream_each_get_their_own_answer(server: ScriptedServer) -> None:
    async def scenario() -> list[str]:
        with Client(server.endpoint) as sync:  # the credentials the server published
            credentials = sync.credentials
        channel = aio_channel(server.endpoint, credentials, traced=False)
        stub = client_pb2_grpc.KvplaneStub(channel)
        stream = CallStream("report", stub.ReportStream, lambda r, t: stub.Report(r, timeout=t), lambda: REPORT_TIMEOUT_S)
        try:
            answers = await asyncio.gather(*(stream.call(client_pb2.ReportRequest(placement_id=f"p{i}", event=FIRST)) for i in range(50)))
            return [a.placement_id for a in answers]
        finally:
            stream.end()
            await channel.close()

    assert asyncio.run(scenario()) == [f"p{i}" for i in range(50)]
    assert server.servicer.num_report_streams == 1


def test_a_caller_that_gives_up_before_its_message_is_written_leaves_the_stream_open(server: ScriptedServer) -> None:
    """Cancelled while the stream's first message is unanswered (its own not yet queued), it
    takes nothing down: the first message is answered on the same stream, and so is the next."""

    async def scenario() -> tuple[str, str]:
        with Client(server.endpoint) as sync:
            credentials = sync.credentials
        channel = aio_channel(server.endpoint, credentials, traced=False)
        stub = client_pb2_grpc.KvplaneStub(channel)
        stream = CallStream("report", stub.ReportStream, lambda r, t: stub.Report(r, timeout=t), lambda: REPORT_TIMEOUT_S)
        try:
            first = asyncio.ensure_future(stream.call(client_pb2.ReportRequest(placement_id="first", event=FIRST)))
            await asyncio.sleep(0)  # the stream is open and its first message on its way
            waiter = asyncio.ensure_future(stream.call(client_pb2.ReportRequest(placement_id="gave-up", event=FIRST)))
            await asyncio.sleep(0)
            waiter.cancel()
            answer = await first
            after = await stream.call(client_pb2.ReportRequest(placement_id="after", event=FIRST))
            return answer.placement_id, after.placement_id
        finally:
            stream.end()
            await channel.close()

    assert asyncio.run(scenario()) == ("first", "after")
    assert server.servicer.num_report_streams == 1


def test_both_clients_report_a_remote_prefills_end_and_keep_it_from_their_caller(server: ScriptedServer) -> None:
    """A placement prefilled on another worker: the SDK asks its agent for the prefill's end
    (report_prefill_done), reports it, and yields tokens and the end only."""

    async def stream_async() -> list:
        async with AsyncClient(server.endpoint) as client:
            return [c async for c in client.stream("remote-ab", max_tokens=16, lookaside=True)]

    chunks = asyncio.run(stream_async())
    with Client(server.endpoint) as client:
        chunks += list(client.stream("remote-cd", max_tokens=16, lookaside=True))
        assert client.generate("local", max_tokens=8, lookaside=True).text == "local"
    assert "".join(c.text for c in chunks) == "remote-abremote-cd"
    assert all(c.token_ids or c.finished for c in chunks)
    assert sorted(server.servicer.reports) == sorted(
        [("stream", PREFILL_DONE), ("stream", FIRST), ("stream", FINISHED)]
        + [("call", PREFILL_DONE)]
        + [("call", FIRST)] * 2
        + [("call", FINISHED)] * 2
    )

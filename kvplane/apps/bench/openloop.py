"""The open-loop load generator of `kvplane bench controlplane`: one process, one control-plane
replica, steps on command.

`python -m kvplane.apps.bench.openloop --endpoint HOST:PORT` reads one JSON step per line on stdin
({"shape", "mode", "rate_rps", "duration_s", "grace_s", "seed"}, or {"connect": [agent endpoints]}
to open channels to the agents first) and answers each with one JSON line on stdout. A step sends requests at Poisson arrival times for `duration_s` whatever the
server does (open loop), each on its own task, then waits up to `grace_s` for the last ones;
those still running are cancelled and count as errors ("TIMEOUT").

Requests are token ids (no tokenizer), built before the step's clock starts so the generator
spends its step only on sending and reading: a random first block per request (so no two share
a cached prefix) then a fixed body, `max_tokens` with ignore_eos. A request "mode" is one async
function (MODES): `relay` streams Kvplane.Generate through the control plane; `lookaside` gets a
placement (Route with lookaside), streams from the decode agent and reports back on one
ReportStream, as the asyncio SDK does; `lookaside-calls` the same with a Report call per report,
as the blocking SDK does (the baseline of the stream). A mode raises on
failure and sets the sample's first-token time; it must receive exactly max_tokens tokens.

The answer carries, per request, arrival / completion times from the step's start and the time
to first token, plus this process's CPU seconds over the step (so a saturated generator shows).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import string
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from kvplane.apps.bench.workload import poisson_arrivals
from kvplane.call_stream import CallStream
from kvplane.grpc_util import aio_channel
from kvplane.security.credentials import Credentials, resolve_client
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2


@dataclass(frozen=True, slots=True)
class Shape:
    prompt_tokens: int
    max_tokens: int


SHAPES = {"short": Shape(128, 32), "long": Shape(4096, 256)}
VOCAB = 32000  # token ids below every simulated model's vocabulary
BLOCK = 16  # tokens of the random head that makes each prompt's first block its own


@dataclass(slots=True)
class Target:
    """What a mode talks to: the replica's Kvplane stub, the credentials it dialled with (a
    lookaside mode dials agents with them), and the per-request deadline."""

    kvplane: client_pb2_grpc.KvplaneStub
    credentials: Credentials
    timeout_s: float
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)  # other endpoints a mode dialled
    report_stream: CallStream | None = None  # lookaside reports, opened on first use

    def reports(self) -> CallStream:
        if self.report_stream is None:
            stub = self.kvplane
            self.report_stream = CallStream(
                "lookaside report", stub.ReportStream, lambda r, t: stub.Report(r, timeout=t), lambda: self.timeout_s
            )
        return self.report_stream


@dataclass(slots=True)
class Sample:
    sent: float  # loop time the request was sent
    first_token: float | None = None
    done: float | None = None  # finished with every token
    error: str = ""


class ShortStream(Exception):
    pass


class ReportRefused(Exception):
    pass


async def relay(target: Target, request: client_pb2.GenerateRequest, sample: Sample) -> None:
    """The request streamed through the control plane (Kvplane.Generate): every token crosses it."""
    loop = asyncio.get_running_loop()
    num_tokens = 0
    async for reply in target.kvplane.Generate(request, timeout=target.timeout_s):
        if reply.token_ids:
            if sample.first_token is None:
                sample.first_token = loop.time()
            num_tokens += len(reply.token_ids)
    if num_tokens != request.sampling.max_tokens:
        raise ShortStream(f"{num_tokens} of {request.sampling.max_tokens} tokens")


async def lookaside(target: Target, request: client_pb2.GenerateRequest, sample: Sample, streamed: bool = True) -> None:
    """The request placed by the control plane and streamed from the decode agent (lookaside
    mode), with the reports the SDK sends: the first token in the background, the end awaited;
    on the report stream, or (`streamed` False) a Report call each."""
    loop = asyncio.get_running_loop()
    placed = client_pb2.GenerateRequest()
    placed.CopyFrom(request)
    placed.lookaside = True
    placement = (await target.kvplane.Route(placed, timeout=target.timeout_s)).placement
    channel = target.channels.get(placement.endpoint)
    if channel is None:
        channel = target.channels[placement.endpoint] = aio_channel(placement.endpoint, target.credentials, traced=False)
    agent = agent_pb2_grpc.AgentStub(channel)
    report = target.reports().call if streamed else functools.partial(target.kvplane.Report, timeout=target.timeout_s)
    num_tokens, final, first_report = 0, None, None
    async for reply in agent.Generate(agent_pb2.AgentGenerateRequest.FromString(placement.agent_request), timeout=target.timeout_s):
        if reply.token_ids:
            if sample.first_token is None:
                sample.first_token = loop.time()
                event = client_pb2.ReportRequest(placement_id=placement.placement_id, event=client_pb2.ReportRequest.FIRST_TOKEN)
                first_report = asyncio.ensure_future(report(event))
            num_tokens += len(reply.token_ids)
        if reply.finished:
            final = reply
    if num_tokens != request.sampling.max_tokens or final is None:
        raise ShortStream(f"{num_tokens} of {request.sampling.max_tokens} tokens")
    end = client_pb2.ReportRequest(placement_id=placement.placement_id, event=client_pb2.ReportRequest.FINISHED, num_tokens=num_tokens)
    end.metrics.CopyFrom(final.metrics)
    end.ttft_ms = (sample.first_token - sample.sent) * 1000
    answer = await report(end)
    if isinstance(answer, client_pb2.ReportAnswer) and answer.code:
        raise ReportRefused(f"the end's report was answered {answer.code}: {answer.message}")
    if first_report is not None:
        await asyncio.gather(first_report, return_exceptions=True)  # a call's NOT_FOUND when the end overtook it


Mode = Callable[[Target, client_pb2.GenerateRequest, Sample], Awaitable[None]]
MODES: dict[str, Mode] = {"relay": relay, "lookaside": lookaside, "lookaside-calls": functools.partial(lookaside, streamed=False)}


def build_requests(
    shape: Shape, count: int, rng: random.Random, stream_interval: int = 0, text: bool = False
) -> list[client_pb2.GenerateRequest]:
    """`text`: prompts of ASCII letters, one token each for the sim workers' byte tokenizer."""
    letters = [ord(c) for c in string.ascii_letters]

    def token() -> int:
        return rng.choice(letters) if text else rng.randrange(VOCAB)

    body = [token() for _ in range(shape.prompt_tokens)]
    sampling = common_pb2.SamplingParams(max_tokens=shape.max_tokens, ignore_eos=True)
    requests = []
    for _ in range(count):
        ids = [token() for _ in range(BLOCK)] + body[BLOCK:]
        prompt = {"text": bytes(ids).decode()} if text else {"token_ids": client_pb2.TokenIds(ids=ids)}
        requests.append(client_pb2.GenerateRequest(**prompt, sampling=sampling, stream_interval=stream_interval))
    return requests


async def run_step(target: Target, command: dict) -> dict:
    mode = MODES[command["mode"]]
    shape = SHAPES[command["shape"]]
    rng = random.Random(command.get("seed", 0))
    arrivals = poisson_arrivals(command["rate_rps"], command["duration_s"], rng)
    requests = build_requests(shape, len(arrivals), rng, command.get("stream_interval", 0), command.get("text", False))
    loop = asyncio.get_running_loop()
    cpu_started = time.process_time()
    start = loop.time()
    samples: list[Sample] = []
    tasks = []

    async def one(request: client_pb2.GenerateRequest, sample: Sample) -> None:
        try:
            await mode(target, request, sample)
            sample.done = loop.time()
        except grpc.aio.AioRpcError as e:
            sample.error = e.code().name
            print(f"request failed: {e.code().name}: {e.details()}", file=sys.stderr, flush=True)  # the generator's log
        except ShortStream:
            sample.error = "SHORT_STREAM"

    for at, request in zip(arrivals, requests, strict=True):
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sample = Sample(sent=loop.time())
        samples.append(sample)
        tasks.append(asyncio.create_task(one(request, sample)))
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, start + command["duration_s"] + command["grace_s"] - loop.time()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    wall = loop.time() - start
    errors: dict[str, int] = {}
    for s in samples:
        if s.done is None:
            errors[s.error or "TIMEOUT"] = errors.get(s.error or "TIMEOUT", 0) + 1
    ok = [s for s in samples if s.done is not None]
    return {
        "sent": len(samples),
        "ok": len(ok),
        "errors": errors,
        "arrivals_s": [round(s.sent - start, 4) for s in samples],
        "completions_s": [round(s.done - start, 4) for s in ok],
        "latencies_s": [round(s.done - s.sent, 4) for s in ok],
        "ttfts_s": [round(s.first_token - s.sent, 4) for s in ok if s.first_token is not None],
        "cpu_s": time.process_time() - cpu_started,
        "wall_s": wall,
    }


async def connect(target: Target, endpoints: list[str]) -> dict:
    """Opens a channel to each agent before lookaside steps (as a lookaside client keeps a pool),
    so that the steps measure requests, not TLS handshakes."""
    for endpoint in endpoints:
        if endpoint not in target.channels:
            target.channels[endpoint] = aio_channel(endpoint, target.credentials, traced=False)
    ready = await asyncio.gather(
        *(asyncio.wait_for(target.channels[e].channel_ready(), target.timeout_s) for e in endpoints), return_exceptions=True
    )
    return {"connected": sum(r is None for r in ready), "failed": sum(r is not None for r in ready)}


async def serve(endpoint: str, timeout_s: float) -> None:
    credentials = resolve_client(endpoint)
    channel = aio_channel(endpoint, credentials, traced=False)
    target = Target(client_pb2_grpc.KvplaneStub(channel), credentials, timeout_s)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    try:
        while line := await reader.readline():
            command = json.loads(line)
            answer = await connect(target, command["connect"]) if "connect" in command else await run_step(target, command)
            print(json.dumps(answer), flush=True)
    finally:
        if target.report_stream is not None:
            target.report_stream.end()
        for other in target.channels.values():
            await other.close()
        await channel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvplane.apps.bench.openloop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True, help="the control-plane replica this generator sends to")
    parser.add_argument("--timeout", type=float, default=60.0, help="deadline per request, seconds (default %(default)s)")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.endpoint, args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())

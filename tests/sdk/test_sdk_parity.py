"""Client and AsyncClient are one core in two I/O shells: the same methods, the same answers, the same rules."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import grpc
import pytest

import kvplane
from kvplane import AsyncClient, Client
from kvplane.client import (
    ClusterStats,
    LatencySummary,
    RequestOptions,
    WorkerStats,
)
from tests.sdk.scripted_server import ScriptedServer

METHODS = ("cache", "close", "config", "drain", "generate", "profile", "route", "set_config", "stats", "stream", "undrain", "workers")
# (method, args, kwargs): one call of every RPC, answered the same way every time by the scripted server.
CALLS: tuple[tuple[str, tuple, dict[str, Any]], ...] = (
    ("generate", ("hello",), {"max_tokens": 4, "priority": "batch"}),
    ("generate", ("hello", RequestOptions(max_tokens=8)), {"max_tokens": 2}),
    ("stream", ([104, 105, 106],), {"max_tokens": 3}),
    ("route", ("p",), {"disagg": "never"}),
    ("workers", (), {}),
    ("cache", (), {}),
    ("stats", (30.0,), {}),
    ("drain", ("decode-0",), {}),
    ("undrain", ("decode-0",), {}),
    ("config", (), {}),
    ("set_config", ("admission.policy", "threshold"), {}),
    ("profile", ("prefill-0",), {"max_batch": 4}),
)


def _public(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


def test_both_clients_offer_the_same_methods_with_the_same_parameters() -> None:
    sync, aio = _public(Client), _public(AsyncClient)
    assert sorted(sync) == sorted(aio) == sorted(METHODS)
    for name in METHODS:
        assert inspect.signature(sync[name]).parameters == inspect.signature(aio[name]).parameters, name
        # Every asyncio method is a coroutine except stream, an async iterator returned at once.
        assert inspect.iscoroutinefunction(aio[name]) is (name != "stream"), name


def test_both_clients_give_the_same_answers(server: ScriptedServer) -> None:
    def run_sync() -> list[Any]:
        answers = []
        with Client(server.endpoint) as client:
            for name, args, kwargs in CALLS:
                answer = getattr(client, name)(*args, **kwargs)
                answers.append(list(answer) if name == "stream" else answer)
        return answers

    async def run_async() -> list[Any]:
        answers = []
        async with AsyncClient(server.endpoint) as client:
            for name, args, kwargs in CALLS:
                if name == "stream":
                    answers.append([c async for c in client.stream(*args, **kwargs)])
                else:
                    answers.append(await getattr(client, name)(*args, **kwargs))
        return answers

    sync_answers = run_sync()
    sync_requests = list(server.servicer.requests)
    assert asyncio.run(run_async()) == sync_answers
    assert server.servicer.requests[len(sync_requests) :] == sync_requests  # the same messages went out
    generate, options_generate = sync_answers[0], sync_answers[1]
    assert (generate.text, options_generate.text) == ("hell", "he")  # keyword fields override options
    assert sync_requests[0].priority == "batch"
    assert sync_answers[6] == ClusterStats(
        workers=(WorkerStats("decode-0", 3, LatencySummary(3, 10.0, 9.0, 12.0, 12.5), LatencySummary(20, 2.0, 1.5, 3.0, 4.0),
                             30, 12, 8192),),
        window_s=60.0, metrics_url="http://127.0.0.1:9100/metrics",
    )  # fmt: skip
    assert sync_answers[6].workers[0].cache_hit_rate == 0.4
    assert server.servicer.stats_windows == [30.0, 30.0]


def test_admin_calls_keep_the_clients_deadline(server: ScriptedServer) -> None:
    started = time.monotonic()
    with Client(server.endpoint, timeout=0.3) as client, pytest.raises(kvplane.UnavailableError) as info:
        client.drain("slow")
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    async def scenario() -> None:
        async with AsyncClient(server.endpoint, timeout=0.3) as client:
            with pytest.raises(kvplane.UnavailableError) as info:
                await client.drain("slow")
            assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    asyncio.run(scenario())
    assert time.monotonic() - started < 4.0  # neither waited for the 5 s answer


def test_unknown_keyword_is_refused_before_sending(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(TypeError, match="unknown request option"):
        client.generate("x", max_token=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown request option"):
        AsyncClient(server.endpoint).stream("x", temp=0.5)  # type: ignore[call-arg]
    assert server.servicer.requests == []

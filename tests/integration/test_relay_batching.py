"""Relaying through the coalescing reader loses, reorders and duplicates nothing: a caller that
pauses mid-stream gets the same tokens and text as one that waits for the whole answer, and the
end with its metrics. (How many messages it gets depends on gRPC's flow-control window: the
merging itself is tested on its own in tests/controlplane/test_relay_coalescing.py.)"""

from __future__ import annotations

import time

import grpc
import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster
from kvplane.v1 import client_pb2

from .helpers import prompt_ids

pytestmark = pytest.mark.cluster  # starts processes


def test_a_reader_that_pauses_gets_the_same_tokens_and_end():
    prompt = prompt_ids(seed=31, length=20)
    with LocalCluster(num_prefill=0, num_decode=0, num_both=1) as cluster, Client(cluster.endpoint, timeout=120) as client:
        fast = client.generate(prompt, max_tokens=48, ignore_eos=True)
        chunks = []
        for chunk in client.stream(prompt, max_tokens=48, ignore_eos=True):
            chunks.append(chunk)
            if len(chunks) == 1:
                time.sleep(2.0)  # the engine generates the rest meanwhile
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == list(fast.token_ids) and len(tokens) == 48
    assert "".join(c.text for c in chunks) == fast.text
    assert chunks[-1].finished and chunks[-1].metrics is not None and chunks[-1].metrics.cached_tokens > 0
    assert sum(c.finished for c in chunks) == 1 and len(chunks) <= 49


def test_a_resume_after_the_last_token_gets_only_the_end_and_a_longer_one_is_refused():
    """A replica that died between a stream's last token and its end: the caller resumes with every
    token it has, and the next replica answers with the end alone (no request is run)."""

    prompt = prompt_ids(seed=32, length=20)
    with LocalCluster(num_prefill=0, num_decode=0, num_both=1) as cluster, Client(cluster.endpoint, timeout=60) as client:
        done = client.generate(prompt, max_tokens=6, ignore_eos=True)
        stub = client._stubs[cluster.endpoint]
        request = client_pb2.GenerateRequest(token_ids=client_pb2.TokenIds(ids=prompt), resume_token_ids=list(done.token_ids))
        request.sampling.max_tokens = 6
        replies = list(stub.Generate(request, timeout=30))
        assert [(list(r.token_ids), r.finished, r.finish_reason) for r in replies] == [([], True, "length")]
        request.resume_token_ids.append(1)
        try:
            list(stub.Generate(request, timeout=30))
            raise AssertionError("a resume longer than max_tokens was accepted")
        except grpc.RpcError as e:
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "more than max_tokens 6" in e.details()
        assert client.generate(prompt, max_tokens=2).token_ids  # still serving


def test_a_stream_interval_sends_the_first_token_alone_then_chunks_and_a_bad_one_is_refused():
    """stream_interval=8: the agent sends the first token at once and then 8 tokens a message (the
    relay may merge messages that queued, never split them); generate(), which keeps only the
    whole answer, asks for 16 by itself. The answer is the same every way."""
    prompt = prompt_ids(seed=33, length=20)
    with LocalCluster(num_prefill=0, num_decode=0, num_both=1) as cluster, Client(cluster.endpoint, timeout=120) as client:
        every = list(client.stream(prompt, max_tokens=48, ignore_eos=True))
        chunked = list(client.stream(prompt, max_tokens=48, ignore_eos=True, stream_interval=8))
        collected = client.generate(prompt, max_tokens=48, ignore_eos=True)
        with pytest.raises(Exception) as info:
            client.generate(prompt, max_tokens=4, stream_interval=5000)
        request = client_pb2.GenerateRequest(token_ids=client_pb2.TokenIds(ids=prompt), stream_interval=5000)
        request.sampling.max_tokens = 4
        with pytest.raises(grpc.RpcError) as refused:
            list(client._stubs[cluster.endpoint].Generate(request, timeout=30))
    tokens = [t for c in every for t in c.token_ids]
    assert tokens == [t for c in chunked for t in c.token_ids] == list(collected.token_ids) and len(tokens) == 48
    assert "".join(c.text for c in chunked) == "".join(c.text for c in every) == collected.text
    sizes = [len(c.token_ids) for c in chunked]
    assert sizes[0] == 1 and all(size % 8 == 0 for size in sizes[1:-1]) and len(chunked) <= 1 + -(-47 // 8), sizes
    assert chunked[-1].finished and chunked[-1].metrics is not None
    assert "stream_interval" in str(info.value)  # the SDK checks it before sending
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "stream_interval is at most 4096" in refused.value.details()

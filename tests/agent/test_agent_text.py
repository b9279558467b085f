"""Who detokenizes an answer: a relaying control plane asks for token ids only (tokens_only) and
makes the text itself; a lookaside caller gets the text from the agent. Real agent, real reference
engine (builtin byte-tokenizer model), greedy so that both runs give the same tokens."""

from __future__ import annotations

import asyncio

from kvplane.tokenizer import ByteTokenizer
from kvplane.types import Role
from kvplane.v1 import agent_pb2, common_pb2

from .helpers import serve_agent, ticketed

PROMPT = list(b"Once upon a time, in a land far away, ")


def _request(request_id: str, **fields) -> agent_pb2.AgentGenerateRequest:
    sampling = common_pb2.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    return ticketed(agent_pb2.AgentGenerateRequest(request_id=request_id, prompt_token_ids=PROMPT, sampling=sampling, **fields), "w")


def test_tokens_only_replies_carry_no_text_and_the_same_tokens():
    async def body():
        async with serve_agent("w", Role.BOTH) as agent:
            with_text = [r async for r in agent.stub.Generate(_request("r1"))]
            ids_only = [r async for r in agent.stub.Generate(_request("r2", tokens_only=True))]
        tokens = [t for r in with_text for t in r.token_ids]
        assert len(tokens) == 24 and [t for r in ids_only for t in r.token_ids] == tokens
        assert "".join(r.text for r in with_text) == ByteTokenizer().decode(tokens) != ""
        assert all(r.text == "" for r in ids_only)
        assert ids_only[-1].finished and ids_only[-1].metrics.prompt_tokens == with_text[-1].metrics.prompt_tokens

    asyncio.run(body())

"""Issue 28, items 1 and 2: KV that a peer sends is checked before this worker caches or serves it.

A compromised prefill worker runs the real agent code and cheats after it (a subclass of
AgentService): it names another tenant's block hashes, vouches for NaN KV, or serves other bytes
than the ones it vouched for, over either transport. Real agents with real reference engines over
loopback gRPC; the test plays the control plane (it signs the tickets). After each attack the
request is still answered correctly (the decode worker prefills locally), the prompt's and the
victim's next requests find nothing planted, and no block stays pinned on either side.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from kvplane.block_hash import hash_blocks
from kvplane.dataplane.agent.service import AgentService
from kvplane.dataplane.transport.integrity import block_digests
from kvplane.types import Role
from kvplane.v1 import agent_pb2, common_pb2

from ..agent.helpers import serve_agent, ticketed, wait_until

BLOCK = 16
PROMPT_A = [(5 * i + 1) % 250 for i in range(BLOCK * 6 + 5)]  # the attacker's (tenant A's) prompt: six full blocks
PROMPT_B = [(11 * i + 7) % 250 for i in range(BLOCK * 6 + 5)]  # the victim's (tenant B's): as many blocks
SALT_A, SALT_B = "t/a/", "t/b/"
SAMPLING = common_pb2.SamplingParams(max_tokens=12)


def _overwrite_pinned(service: AgentService, transfer_id: str, kind: str) -> list[int]:
    """Fills the transfer's pinned blocks with finite random KV or NaN; returns their ids."""
    pool = service._kv.pool.buffer
    block_ids = service._pins[transfer_id].block_ids
    generator = torch.Generator().manual_seed(28)
    for b in block_ids:
        fill = torch.randn(pool[b].shape, generator=generator) if kind == "random" else torch.full(pool[b].shape, float("nan"))
        pool[b].copy_(fill)
    return block_ids


def _vouch(service: AgentService, reply: agent_pb2.PrefillResponse, block_ids: list[int]) -> None:
    """Replaces the answer's digests with true digests of the blocks' current bytes."""
    del reply.block_digests[:]
    reply.block_digests.extend(block_digests(service._kv.pool, block_ids))


class PlantsUnderVictimsHashes(AgentService):
    """Asked to prefill A's prompt: serves KV of its own choosing, vouches for exactly those bytes,
    and names B's block hashes (B's salt is guessable), a write into B's prefix cache."""

    async def Prefill(self, request, context):
        reply = await super().Prefill(request, context)
        _vouch(self, reply, _overwrite_pinned(self, reply.transfer_id, "random"))
        reply.block_hashes[:] = hash_blocks(PROMPT_B, BLOCK, self._engine.info.model, SALT_B)
        return reply


class VouchesForNaN(AgentService):
    """Honest hashes, and digests that match the bytes it serves: but those bytes are NaN."""

    async def Prefill(self, request, context):
        reply = await super().Prefill(request, context)
        _vouch(self, reply, _overwrite_pinned(self, reply.transfer_id, "nan"))
        return reply


def serves_other_bytes(kind: str) -> type[AgentService]:
    """Answers honestly (hashes and digests of its real KV), then the bytes that reach the puller
    are other ones: what a writer on the unauthenticated data path (NIXL's UCX) could do."""

    class ServesOtherBytes(AgentService):
        async def Prefill(self, request, context):
            reply = await super().Prefill(request, context)
            _overwrite_pinned(self, reply.transfer_id, kind)
            return reply

    return ServesOtherBytes


async def _generate(stub, request_id: str, worker: str, prompt: list[int], salt: str, source=None) -> tuple[list[int], object]:
    request = agent_pb2.AgentGenerateRequest(request_id=request_id, prompt_token_ids=prompt, cache_salt=salt, sampling=SAMPLING)
    if source is not None:
        request.prefill_from.CopyFrom(source)
    ticketed(request, worker)  # the control plane's ticket: it signs the prefill source and sampling too
    tokens, metrics = [], None
    async for reply in stub.Generate(request):
        tokens.extend(reply.token_ids)
        if reply.finished:
            metrics = reply.metrics
    return tokens, metrics


async def _attack(evil_class: type[AgentService], transports: tuple[str, ...] = ("grpc",)) -> dict:
    """Tenant A's request, disaggregated with the evil worker as its prefill peer; then B's request
    and A's again, locally on the same decode worker; the same on a clean worker for reference."""
    async with (
        serve_agent("evil", Role.PREFILL, transports=transports, service_class=evil_class) as evil,
        serve_agent("decode", Role.DECODE, transports=transports) as decode,
        serve_agent("clean", Role.BOTH) as clean,
    ):
        source = agent_pb2.PrefillSource(worker_id="evil", endpoint=evil.endpoint)
        seen = {"attacked": await _generate(decode.stub, "a1", "decode", PROMPT_A, SALT_A, source)}
        seen["pinned_on_decode"] = decode.service.num_pinned_blocks
        await wait_until(lambda: evil.service.num_pinned_blocks == 0, "the evil peer's pins are released")
        seen["victim"] = await _generate(decode.stub, "b1", "decode", PROMPT_B, SALT_B)
        seen["again"] = await _generate(decode.stub, "a2", "decode", PROMPT_A, SALT_A)
        seen["clean_a"] = await _generate(clean.stub, "a3", "clean", PROMPT_A, SALT_A)
        seen["clean_b"] = await _generate(clean.stub, "b2", "clean", PROMPT_B, SALT_B)
        seen["pinned_after"] = decode.service.num_pinned_blocks
        return seen


def _assert_nothing_planted(seen: dict, refusals: list[str], reason: str) -> None:
    tokens, metrics = seen["attacked"]
    clean_a, clean_b = seen["clean_a"][0], seen["clean_b"][0]
    assert len(clean_a) == 12
    # The import failed cleanly: the decode worker prefilled A itself and answered correctly.
    assert tokens == clean_a
    assert (metrics.disaggregated, metrics.prefill_worker, metrics.kv_transfer_blocks) == (False, "decode", 0)
    assert seen["pinned_on_decode"] == seen["pinned_after"] == 0
    # B's request finds nothing of the attacker's in the cache and gets B's own answer.
    victim_tokens, victim_metrics = seen["victim"]
    assert victim_metrics.cached_tokens == 0
    assert victim_tokens == clean_b
    # A's blocks on the decode worker are the ones it computed, not the peer's.
    again_tokens, again_metrics = seen["again"]
    assert again_metrics.cached_tokens == 6 * BLOCK
    assert again_tokens == clean_a
    # Refused once, for the reason the attack should meet.
    assert len(refusals) == 1 and reason in refusals[0], refusals


def _refusals(caplog) -> list[str]:
    """The decode agent's log lines saying why it imported nothing (no prompt text in them)."""
    return [r.getMessage() for r in caplog.records if "failed its check and was not imported" in r.getMessage()]


def test_a_peer_naming_another_tenants_block_hashes_plants_nothing(caplog):
    seen = asyncio.run(_attack(PlantsUnderVictimsHashes))
    _assert_nothing_planted(seen, _refusals(caplog), "block hashes that are not this prompt's")


def test_nan_kv_is_refused_even_when_its_producer_vouches_for_it(caplog):
    seen = asyncio.run(_attack(VouchesForNaN))
    _assert_nothing_planted(seen, _refusals(caplog), "6 of 6 pulled blocks hold NaN or infinite values")


@pytest.mark.parametrize("kind", ["random", "nan"])
@pytest.mark.parametrize("transport", ["grpc", "nixl"])
def test_bytes_other_than_the_producer_vouched_for_are_refused(transport, kind, caplog):
    if transport == "nixl":
        pytest.importorskip("nixl", reason="the nixl package is not installed (pip install 'kvplane[nixl]')")
    seen = asyncio.run(_attack(serves_other_bytes(kind), transports=(transport,)))
    _assert_nothing_planted(seen, _refusals(caplog), "pulled block 0 of 6 does not hash to the digest its producer sent")

"""ModelRunner: turns a step's scheduled chunks into one model call and samples the due tokens."""

from __future__ import annotations

from collections.abc import Sequence

from dataplane.engines.paged.scheduler import ScheduledChunk
from dataplane.engines.reference.kv_pool import KVPool
from dataplane.engines.reference.model import PagedBatch, PagedLlama
from dataplane.engines.reference.sampling import sample


class ModelRunner:
    __slots__ = ("model", "pool")

    def __init__(self, model: PagedLlama, pool: KVPool) -> None:
        self.model = model
        self.pool = pool

    def run(self, chunks: Sequence[ScheduledChunk]) -> list[int | None]:
        """Compute every chunk's KV into the pool; a sampled token per chunk that completes its
        sequence's known tokens (None for mid-prompt chunks and prefill_only requests)."""
        batch = PagedBatch.build(
            [(c.seq.token_ids[c.start : c.start + c.num_tokens], c.start, c.seq.block_ids) for c in chunks],
            block_size=self.pool.layout.block_size,
            device=self.pool.device,
        )
        logits = self.model(batch, self.pool.buffer, batch.last_token_index).cpu()
        tokens: list[int | None] = []
        for row, c in zip(logits, chunks):
            due = c.completes_known_tokens and not c.seq.request.prefill_only
            tokens.append(sample(row, c.seq.request.sampling, c.seq.generator) if due else None)
        return tokens

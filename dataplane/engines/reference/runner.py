"""ModelRunner: turns a step's scheduled chunks into one model call and samples the due tokens.

Failures stay with their request: sampling runs row by row and a row that raises yields that
exception in its slot (the engine fails that request only); a forward pass that raises for the
whole batch is reported to the engine, which re-runs the chunks one at a time to find the culprit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvplane.dataplane.engines.paged.scheduler import ScheduledChunk
from kvplane.dataplane.engines.reference.kv_pool import KVPool
from kvplane.dataplane.engines.reference.model import PagedBatch, PagedLlama
from kvplane.dataplane.engines.reference.sampling import sample

# One chunk's outcome: a sampled token, None (nothing due: mid-prompt or prefill_only), or the
# exception its sampling raised.
ChunkResult = int | None | Exception


class ModelRunner:
    __slots__ = ("model", "pool")

    def __init__(self, model: PagedLlama, pool: KVPool) -> None:
        self.model = model
        self.pool = pool

    def forward(self, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
        """Computes every chunk's KV into the pool; returns each chunk's last-position logits on CPU.

        Writing a chunk's KV twice writes the same values, so re-running a chunk is harmless."""
        batch = PagedBatch.build(
            [(c.seq.token_ids[c.start : c.start + c.num_tokens], c.start, c.seq.block_ids) for c in chunks],
            block_size=self.pool.layout.block_size,
            device=self.pool.device,
        )
        return self.model(batch, self.pool.buffer, batch.last_token_index).cpu()

    def sample(self, chunks: Sequence[ScheduledChunk], logits: torch.Tensor) -> list[ChunkResult]:
        """A result per chunk: the token for each chunk that completes its sequence's known tokens."""
        results: list[ChunkResult] = []
        for row, c in zip(logits, chunks):
            if not c.completes_known_tokens or c.seq.request.prefill_only:
                results.append(None)
                continue
            try:
                results.append(sample(row, c.seq.request.sampling, c.seq.generator))
            except Exception as e:  # this request's sampling failed; the others' stand
                results.append(e)
        return results

    def run(self, chunks: Sequence[ScheduledChunk]) -> list[ChunkResult]:
        """forward, then sample."""
        return self.sample(chunks, self.forward(chunks))

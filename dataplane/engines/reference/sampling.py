"""Token sampling: greedy, or temperature + top-k + top-p with a per-request torch.Generator.

Rule: temperature 0 (or below kvplane.sampling.MIN_TEMPERATURE) -> argmax. Otherwise logits / temperature; keep the top_k largest (0 = all;
ties at the k-th value are kept); then keep the smallest set of most likely tokens whose
probability mass reaches top_p (the most likely token always stays); sample from the renormalised
rest with the request's own generator. Each request owns its generator and rows are sampled one
by one, so the tokens depend only on the seed and the logits, never on the batch.
"""

from __future__ import annotations

import torch

from kvplane.dataplane.engines.request import SamplingParams
from kvplane.sampling import is_greedy


def make_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution sampled from, for one row of float logits [vocab] (on CPU)."""
    scaled = logits.float() / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if 0.0 < top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from one row of logits [vocab]. Raises (e.g. on non-finite probabilities) for
    this row alone: the caller fails the one request, not its batch."""
    if is_greedy(params.temperature):
        return int(torch.argmax(logits).item())
    probs = filtered_probs(logits.cpu(), params.temperature, params.top_k, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator).item())

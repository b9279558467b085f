"""Sampling: greedy, top-k, top-p filtering, and seeded reproducibility."""

from __future__ import annotations

import torch

from kvplane.dataplane.engines.reference.sampling import filtered_probs, make_generator, sample
from kvplane.dataplane.engines.request import SamplingParams

LOGITS = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))


def test_greedy_is_argmax_and_ignores_the_generator() -> None:
    assert sample(LOGITS, SamplingParams(temperature=0.0), make_generator(0)) == 1
    assert sample(torch.tensor([3.0, -1.0, 5.0]), SamplingParams(), make_generator(9)) == 2


def test_temperature_one_without_filters_is_the_softmax() -> None:
    torch.testing.assert_close(filtered_probs(LOGITS, 1.0, 0, 1.0), torch.tensor([0.1, 0.4, 0.2, 0.3]))


def test_top_k_keeps_the_k_largest() -> None:
    probs = filtered_probs(LOGITS, 1.0, 2, 1.0)
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7]))


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    # Sorted: 0.4, 0.3, 0.2, 0.1. Mass before each: 0, 0.4, 0.7, 0.9. top_p=0.6 keeps 0.4 and 0.3.
    torch.testing.assert_close(filtered_probs(LOGITS, 1.0, 0, 0.6), torch.tensor([0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7]))
    # A tiny top_p still keeps the most likely token.
    torch.testing.assert_close(filtered_probs(LOGITS, 1.0, 0, 0.01), torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_low_temperature_sharpens() -> None:
    probs = filtered_probs(LOGITS, 0.5, 0, 1.0)
    expected = torch.tensor([0.01, 0.16, 0.04, 0.09]) / 0.30
    torch.testing.assert_close(probs, expected)


def test_filtered_tokens_are_never_sampled_and_seeds_reproduce() -> None:
    params = SamplingParams(temperature=1.0, top_k=2, seed=3)
    gen = make_generator(3)
    draws = [sample(LOGITS, params, gen) for _ in range(200)]
    assert set(draws) == {1, 3}
    gen = make_generator(3)
    assert [sample(LOGITS, params, gen) for _ in range(200)] == draws
    other = make_generator(4)
    assert [sample(LOGITS, params, other) for _ in range(200)] != draws

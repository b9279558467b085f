"""The step-time model: exact recovery, noise, non-negativity, degenerate windows, chunked
prefill, the online window and its seed, protobuf round trips."""

from __future__ import annotations

import random

import pytest

from kvplane.latency import (
    MIN_ONLINE_SAMPLES,
    MIN_SAMPLES,
    OnlineStepModel,
    StepSample,
    StepTimeModel,
    fit,
    prefill_attention,
    samples_from_pb,
    samples_to_pb,
)

# A plausible step: 2 ms fixed, 20 us/prefill token, 3 ns/attention unit, 50 us/seq, 20 ns/context token.
TRUE = (2e-3, 2e-5, 3e-9, 5e-5, 2e-8)


def step(coefficients, pt=0, pa=0, ds=0, dc=0, noise=0.0, rng=None) -> StepSample:
    c = coefficients
    t = c[0] + c[1] * pt + c[2] * pa + c[3] * ds + c[4] * dc
    if noise:
        t *= 1 + rng.gauss(0, noise)
    return StepSample(pt, pa, ds, dc, t)


def mixed_samples(coefficients=TRUE, n=300, noise=0.0, seed=0) -> list[StepSample]:
    """Prefill-only steps (some with a cached prefix), decode-only steps and mixed steps."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 3
        pt = pa = ds = dc = 0
        if kind in (0, 2):
            pt = rng.randint(1, 2048)
            ctx = rng.choice([0, 0, rng.randint(0, 4096)])
            pa = prefill_attention(pt, ctx)
        if kind in (1, 2):
            ds = rng.randint(1, 64)
            dc = ds * rng.randint(1, 4096)  # mean context varies apart from the batch size
        out.append(step(coefficients, pt, pa, ds, dc, noise, rng))
    return out


def test_prefill_attention_is_new_times_context_plus_half_new():
    assert prefill_attention(0, 100) == 0
    assert prefill_attention(1, 0) == 0
    assert prefill_attention(2, 0) == 2
    assert prefill_attention(10, 0) == 50
    assert prefill_attention(10, 5) == 100
    assert prefill_attention(3, 7) == 3 * 7 + 4  # 3 * 8.5 = 25.5, floored


def test_recovers_known_coefficients_from_noise_free_timings():
    model = fit(mixed_samples())
    assert model is not None and model.num_samples == 300 and not model.seeded_from_profile
    assert model.coefficients == pytest.approx(TRUE, rel=1e-6)
    assert model.mean_abs_pct_error < 1e-6


def test_recovers_coefficients_within_a_few_percent_under_noise():
    model = fit(mixed_samples(n=600, noise=0.05, seed=6))
    assert model is not None
    # 5 % multiplicative noise on every step: each coefficient within 6 %, predictions within 2 %.
    assert model.coefficients == pytest.approx(TRUE, rel=0.06)
    assert 0.02 < model.mean_abs_pct_error < 0.06  # ~ E|N(0, 5%)| = 4 %
    truth = StepTimeModel(TRUE, 0, 0.0)
    for n, ctx in [(100, 0), (1000, 0), (2000, 3000)]:
        assert model.prefill_seconds(n, ctx, 512) == pytest.approx(truth.prefill_seconds(n, ctx, 512), rel=0.02)
    for b, ctx in [(1, 500), (16, 16_000), (64, 200_000)]:
        assert model.decode_step_seconds(b, ctx) == pytest.approx(truth.decode_step_seconds(b, ctx), rel=0.02)


def test_stalled_steps_are_left_out_of_the_fit_but_counted_in_its_error():
    samples = mixed_samples(n=300)
    stalled = [
        StepSample(s.prefill_tokens, s.prefill_attention, s.decode_seqs, s.decode_context_tokens, 4 * s.seconds) for s in samples[:6]
    ]
    model = fit(stalled + samples[6:])
    assert model is not None and model.num_samples == 300
    assert model.coefficients == pytest.approx(TRUE, rel=1e-6)
    assert model.mean_abs_pct_error == pytest.approx(6 * 0.75 / 300, rel=1e-6)  # predicted 1/4 of each stalled step


def test_a_window_of_mostly_small_steps_still_prices_its_rare_long_prefill():
    """A live window from a GPU-like engine (the roofline of Llama-3-70B on 4 x H100: a step is flat
    while memory-bound): 280 decode steps, 20 short prefills of a cached agent turn, and the one
    long prefill of the session's first turn. Weighted per step, with that long prefill dropped as
    an "outlier", the fit priced a 936-token prefill at 20 ms of its 74 (measured on simulated
    agents); a rare shape is evidence, not a stall, and no shape outweighs the others by its count."""
    from kvplane.hardware import Roofline, gpu, model

    roofline = Roofline(gpu("h100-sxm"), model("llama-3-70b"), tp=4)
    rng = random.Random(3)

    def timed(pt, pa, ds, dc) -> StepSample:
        return StepSample(pt, pa, ds, dc, roofline.step_seconds(pt, pa, ds, dc))

    samples = [timed(0, 0, ds, ds * rng.randint(600, 1000)) for ds in (rng.choice((1, 1, 2)) for _ in range(280))]
    samples += [timed(72, prefill_attention(72, 800), rng.choice((0, 1)), 0) for _ in range(20)]
    samples.append(timed(936, prefill_attention(936, 0), 0, 0))
    fitted = fit(samples)
    assert fitted is not None
    long_prefill = roofline.step_seconds(936, prefill_attention(936, 0))
    assert fitted.step_seconds(936, prefill_attention(936, 0)) > 0.5 * long_prefill  # was 0.27x
    assert fitted.decode_step_seconds(1, 800) == pytest.approx(roofline.step_seconds(0, 0, 1, 800), rel=0.1)


def test_a_gpu_like_window_is_fitted_with_its_kink_and_prices_short_and_long_prefills():
    """The roofline's step is flat while reading the weights bounds it, then grows with the
    prefill: a straight line through a window of decode steps and short prefills overprices the
    short ones and misses the long ones. The fit tries a kink (prefill tokens a step computes for
    free) and keeps it when it cuts the error."""
    from kvplane.hardware import Roofline, gpu, model

    roofline = Roofline(gpu("h100-sxm"), model("llama-3-70b"), tp=4)
    rng = random.Random(5)

    def timed(pt, pa, ds, dc) -> StepSample:
        return StepSample(pt, pa, ds, dc, roofline.step_seconds(pt, pa, ds, dc))

    samples = [timed(0, 0, ds, ds * rng.randint(600, 1000)) for ds in (rng.randint(1, 6) for _ in range(400))]
    for _ in range(40):
        p, ctx, ds = rng.choice((32, 64, 96, 150, 200, 300, 1024, 2048)), rng.choice((0, 64, 800)), rng.randint(0, 5)
        samples.append(timed(p, prefill_attention(p, ctx), ds, ds * 800))
    fitted = fit(samples)
    line = fit(samples, kinks=())
    assert fitted is not None and line is not None
    assert fitted.free_prefill_tokens > 0 and line.free_prefill_tokens == 0
    assert fitted.mean_abs_pct_error < line.mean_abs_pct_error
    # The straight line here: 512 tokens 25.8 ms of 41.6, 2,048 tokens 113.9 of 160.5.
    for n in (16, 85, 197, 512, 2048):
        truth = roofline.step_seconds(n, prefill_attention(n, 0))
        assert fitted.step_seconds(n, prefill_attention(n, 0)) == pytest.approx(truth, rel=0.25), n


def test_a_straight_window_keeps_a_straight_line():
    """Timings linear in the features (a CPU engine's): no kink cuts the error, none is kept."""
    rng = random.Random(6)
    samples = [
        StepSample(p, prefill_attention(p, 0), d, d * 100, 0.002 + 1e-5 * p + 1e-4 * d)
        for p, d in ((rng.randint(0, 2000), rng.randint(0, 8)) for _ in range(200))
    ]
    fitted = fit(samples)
    assert fitted is not None and fitted.free_prefill_tokens == 0


def test_coefficients_are_never_negative():
    # Timings that a free fit explains with a negative per-sequence cost: time falls with batch size.
    rng = random.Random(9)
    samples = []
    for b in range(1, 40):
        dc = rng.randint(b, 4000)
        samples.append(StepSample(0, 0, b, dc, 0.01 + 1e-6 * dc - 1e-4 * b))
    model = fit(samples)
    assert model is not None
    assert all(c >= 0 for c in model.coefficients)
    assert model.coefficients[3] == 0.0
    # Whatever is left still explains the data as well as non-negative coefficients can.
    assert model.step_seconds(decode_seqs=20, decode_context_tokens=2000) >= 0


def test_step_seconds_never_negative():
    model = StepTimeModel((0.0, 0.0, 0.0, 0.0, 0.0), 10, 0.0)
    assert model.step_seconds(prefill_tokens=5) == 0.0
    assert model.decode_step_seconds(0, 0) == 0.0


def test_too_few_samples_give_no_model():
    samples = mixed_samples(n=MIN_SAMPLES - 1)
    assert fit([]) is None
    assert fit(samples) is None
    assert fit(mixed_samples(n=MIN_SAMPLES)) is not None


def test_decode_only_window_gives_prefill_coefficients_zero():
    rng = random.Random(2)
    samples = []
    for _ in range(50):
        ds = rng.randint(1, 32)
        samples.append(step(TRUE, ds=ds, dc=ds * rng.randint(10, 1000)))
    model = fit(samples)
    assert model is not None
    c = model.coefficients
    assert c[1] == 0.0 and c[2] == 0.0
    assert (c[0], c[3], c[4]) == pytest.approx((TRUE[0], TRUE[3], TRUE[4]), rel=1e-6)


def test_constant_features_fold_into_the_constant():
    # Every step decodes exactly 4 sequences: c3 cannot be told from c0.
    samples = [step(TRUE, ds=4, dc=dc) for dc in range(100, 2000, 100)]
    model = fit(samples)
    assert model is not None
    assert model.coefficients[3] == 0.0
    assert model.coefficients[0] == pytest.approx(TRUE[0] + 4 * TRUE[3], rel=1e-6)
    assert model.decode_step_seconds(4, 1234) == pytest.approx(samples[0].seconds + TRUE[4] * (1234 - 100), rel=1e-6)
    # All-identical samples: the constant alone.
    model = fit([StepSample(0, 0, 0, 0, 0.004)] * 8)
    assert model is not None and model.coefficients == pytest.approx((0.004, 0, 0, 0, 0))


def test_prefill_seconds_sums_chunks_with_growing_context():
    c = (1e-3, 1e-5, 1e-8, 0.0, 0.0)
    model = StepTimeModel(c, 10, 0.0)
    # 1000 new tokens after 100 cached, in chunks of 400: 400 @100, 400 @500, 200 @900.
    expected = sum(c[0] + c[1] * n + c[2] * prefill_attention(n, ctx) for n, ctx in [(400, 100), (400, 500), (200, 900)])
    assert model.prefill_seconds(1000, 100, 400) == pytest.approx(expected, rel=1e-12)
    # One chunk when it fits.
    assert model.prefill_seconds(300, 0, 2048) == pytest.approx(c[0] + c[1] * 300 + c[2] * 45000)
    assert model.prefill_seconds(0, 50, 2048) == 0.0
    with pytest.raises(ValueError, match="chunk_tokens must be positive"):
        model.prefill_seconds(10, 0, 0)


def test_decode_step_seconds():
    model = StepTimeModel(TRUE, 10, 0.0)
    assert model.decode_step_seconds(8, 4000) == pytest.approx(TRUE[0] + 8 * TRUE[3] + 4000 * TRUE[4])


def test_online_model_refits_lazily_over_its_window():
    online = OnlineStepModel(window=64, refit_every=16)
    assert online.model() is None
    old = (1e-3, 1e-5, 0.0, 1e-4, 1e-8)
    online.add(mixed_samples(old, n=64, seed=3))
    first = online.model()
    assert first is not None and first.num_samples == 64
    assert first.coefficients == pytest.approx(old, rel=1e-6, abs=1e-15)
    online.add(mixed_samples(TRUE, n=15, seed=4))
    assert online.model() is first  # below refit_every: no refit
    online.add(mixed_samples(TRUE, n=64, seed=5))
    # The window has rolled over to the new behaviour entirely.
    now = online.model()
    assert now is not first and now.num_samples == 64
    assert now.coefficients == pytest.approx(TRUE, rel=1e-6)


def test_online_model_refits_at_most_once_per_interval_but_at_once_on_a_new_seed():
    now = [0.0]
    online = OnlineStepModel(window=64, refit_every=1, min_interval_s=1.0, clock=lambda: now[0])
    online.add(mixed_samples(n=20, seed=10))
    first = online.model()
    assert first is not None and first.num_samples == 20  # the first model comes at once
    online.add(mixed_samples(n=20, seed=11))
    now[0] = 0.5
    assert online.model() is first
    now[0] = 1.0
    assert online.model().num_samples == 40
    online.seed(mixed_samples(n=10, seed=12))
    now[0] = 1.1
    assert online.model().num_samples == 50 and online.model().seeded_from_profile


def test_online_model_keeps_the_seed_apart_from_the_window():
    online = OnlineStepModel(window=32, refit_every=1)
    profile = mixed_samples(TRUE, n=60, seed=6)
    online.seed(profile)
    seeded = online.model()
    assert seeded is not None and seeded.seeded_from_profile and seeded.num_samples == 60
    assert seeded.coefficients == pytest.approx(TRUE, rel=1e-6)
    # Live traffic that only decodes: the seed still knows prefill, the window cannot evict it.
    rng = random.Random(7)
    decodes = [step(TRUE, ds=(b := rng.randint(1, 16)), dc=b * 300) for _ in range(100)]
    online.add(decodes)
    model = online.model()
    assert model.num_samples == 60 + 32
    assert model.prefill_seconds(1000, 0, 2048) == pytest.approx(TRUE[0] + TRUE[1] * 1000 + TRUE[2] * 500_000, rel=1e-6)
    # A new profile replaces the old seed.
    online.seed(decodes[:10])
    assert online.model().num_samples == 10 + 32


def test_seeding_with_nothing_leaves_an_unseeded_model():
    online = OnlineStepModel(window=32, refit_every=1)
    online.seed([])
    online.add(mixed_samples(n=MIN_ONLINE_SAMPLES))
    model = online.model()
    assert model is not None and not model.seeded_from_profile


def test_a_handful_of_live_steps_without_a_profile_is_no_model_yet():
    online = OnlineStepModel(window=64, refit_every=1)
    online.add(mixed_samples(n=MIN_ONLINE_SAMPLES - 1, seed=13))
    assert online.model() is None
    online.add(mixed_samples(n=1, seed=14))
    assert online.model() is not None and online.model().num_samples == MIN_ONLINE_SAMPLES
    seeded = OnlineStepModel(window=64, refit_every=1)
    seeded.seed(mixed_samples(n=MIN_SAMPLES, seed=15))  # a profile, however short, is a deliberate measurement
    assert seeded.model() is not None


def test_online_model_rejects_bad_parameters():
    with pytest.raises(ValueError):
        OnlineStepModel(window=2)
    with pytest.raises(ValueError):
        OnlineStepModel(refit_every=0)
    with pytest.raises(ValueError):
        OnlineStepModel(min_interval_s=-1)


def test_model_protobuf_round_trip():
    model = StepTimeModel(TRUE, 123, 0.07, seeded_from_profile=True)
    assert StepTimeModel.from_pb(model.to_pb()) == model
    kinked = StepTimeModel(TRUE, 123, 0.07, free_prefill_tokens=256.0)
    assert StepTimeModel.from_pb(kinked.to_pb()) == kinked
    from kvplane.v1 import common_pb2

    assert StepTimeModel.from_pb(common_pb2.LatencyModel()) is None  # unset
    assert StepTimeModel.from_pb(common_pb2.LatencyModel(coefficients=[1.0, -1.0, 0, 0, 0])) is None
    assert StepTimeModel.from_pb(common_pb2.LatencyModel(coefficients=[float("nan"), 0, 0, 0, 0])) is None


def test_samples_protobuf_round_trip():
    samples = mixed_samples(n=20, noise=0.1, seed=8)
    profile = samples_to_pb(samples, measured_at=1700000000.5)
    assert profile.measured_at == 1700000000.5
    assert samples_from_pb(profile) == samples
    # Large attention values survive (uint64).
    big = [StepSample(100_000, 5_000_000_000, 3, 4_000_000_000, 1.5)]
    assert samples_from_pb(samples_to_pb(big, 0.0)) == big


def test_online_samples_age_out_back_to_the_profile():
    from kvplane.latency import OnlineStepModel, StepSample

    now = [0.0]
    online = OnlineStepModel(window=64, refit_every=1, max_age_s=60.0, clock=lambda: now[0])
    fast = [StepSample(n, 0, 0, 0, 0.001 + n * 1e-5) for n in (10, 50, 100, 200, 400, 800)] * 2
    slow = [StepSample(n, 0, 0, 0, 10 * (0.001 + n * 1e-5)) for n in (10, 50, 100, 200, 400, 800)] * 10
    online.seed(fast)
    online.add(slow)  # an overload: steps ten times slower
    overloaded = online.model().step_seconds(prefill_tokens=100)
    now[0] = 61.0  # a minute without steps
    recovered = online.model().step_seconds(prefill_tokens=100)
    assert recovered == pytest.approx(0.002, rel=1e-3)
    assert overloaded > 1.2 * recovered  # the fit weighs fast steps more, but the overload shows

"""Step-time model: how long one engine step takes, fitted from measured steps.

Rule: one engine step's duration is linear in five features,

    seconds = c0 + c1*prefill_tokens + c2*prefill_attention + c3*decode_seqs + c4*decode_context_tokens

where prefill_attention = sum over the step's prefill chunks of new_tokens*(context_before + new_tokens/2),
the quadratic attention work of a chunk. c0 is the fixed cost of a step (launch, sampling, Python),
c1 the per-token matmul work of prefill, c2 its attention, c3 the per-sequence cost of decode and
c4 the KV reads of decode attention. This is the shape of the Mooncake and DistServe latency models
(prefill: linear + quadratic in length; decode: linear in batch size and in total context).
One kink: a GPU step is bound by reading the weights until its tokens' compute exceeds that, so
it is flat in prefill tokens up to some count and then grows (the roofline's max(compute,
memory)); c1 prices only a step's prefill tokens past `free_prefill_tokens` (0: a straight line,
as on a CPU). A line through that kink is right at one end and wrong at the other: fitted on a
window of decode steps and short prefills it overpriced 100-200-token prefills by 30-60 % and
missed 2,048-token ones by 30 % (kvplane sim, 70B on 4 x H100).

Fit: least squares of the relative error (each sample weighted by 1/seconds^2, since timing noise
is proportional to the step: a 2 ms decode step and a 200 ms prefill count alike; the weight is
capped at the 5th percentile of the timings so one freak-fast sample cannot dominate), and no
step *shape* (a power-of-two bucket of prefill tokens by one of decode sequences) weighing as
more than max(SHAPE_CAP_MIN, twice the mean shape's) steps: a live window is what traffic ran,
hundreds of decode steps and a few prefills, and a GPU step is flat while memory-bound, so a line
through the many small steps says little of the large ones. On
column-scaled features (each divided by its largest value, so a 1e9-sized attention term and a
1-sized batch term meet the normal equations on equal terms), solved by Gaussian elimination
with a tiny ridge, under non-negative coefficients (a step never
gets cheaper with more work): a negative coefficient is dropped and the rest refitted (active set),
until none is negative. A feature that does not vary in the samples cannot be told from the
constant and gets 0 (a decode-only window says nothing about prefill). Then one robust pass: steps
whose relative error exceeds max(OUTLIER_MIN, OUTLIER_MADS x the median relative error) (a step
stalled by another process, a page fault) are left out and the rest refitted, but only where
at least OUTLIER_PEERS other steps prefilled as many tokens (within a power of two): a stall is a
step slower than steps like it, while the only long prefill in a window is the evidence for the
prefill terms, not an outlier. The error is reported as the mean absolute percentage error over
all the samples, outliers included. The kink is chosen by fitting at each of KINK_CANDIDATES
(below the window's longest prefill) and keeping the one with the least error, if it is under
KINK_GAIN x the straight line's (no kink for a gain within noise).

OnlineStepModel keeps the last `window` measured steps apart from a profile seed (`kvplane
profile`), and fits on both: the seed covers the shapes live traffic may not show yet, the window
tracks the worker as it runs.

Pure Python: no numpy or torch; protobuf only in the *_pb helpers.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvplane.v1 import common_pb2

NUM_COEFFICIENTS = 5
MIN_SAMPLES = NUM_COEFFICIENTS  # fewer samples than coefficients: no model
# Fewer live steps than this, and no profile: the fit prices noise (a restarted worker's first
# prefill chunks and decode steps fitted a decode step of 74 s), so there is no model yet.
MIN_ONLINE_SAMPLES = 4 * NUM_COEFFICIENTS
RIDGE = 1e-10  # relative to each scaled column's sum of squares; only keeps the system solvable
OUTLIER_MIN = 0.25  # relative error below which a step is never an outlier
OUTLIER_MADS = 5.0  # ... and above this many median relative errors it is
SHAPE_CAP_MIN = 16  # a step shape weighs as at most max(this, twice the mean shape's steps) steps
OUTLIER_PEERS = 4  # ... when at least this many other steps have its prefill size (a power-of-two bucket)
# Candidate kinks (free_prefill_tokens) the fit tries; one is kept only if its error is under
# KINK_GAIN x the straight line's.
KINK_CANDIDATES = (32, 64, 128, 256, 512, 1024)
KINK_GAIN = 0.9


def prefill_hinge(num_tokens: int, free_tokens: float) -> float:
    """The prefill tokens of one step that cost compute time: those past the `free_tokens` a step
    computes within its memory-bound time (reading the weights)."""
    return num_tokens - free_tokens if num_tokens > free_tokens else 0.0


def chunked_hinge(num_new_tokens: int, chunk_tokens: int, free_tokens: float) -> float:
    """prefill_hinge summed over the chunks of a prefill of num_new_tokens (each at most chunk_tokens)."""
    if num_new_tokens <= 0:
        return 0.0
    before_last = -(-num_new_tokens // chunk_tokens) - 1
    return before_last * prefill_hinge(chunk_tokens, free_tokens) + prefill_hinge(num_new_tokens - before_last * chunk_tokens, free_tokens)


def prefill_attention(num_new_tokens: int, num_context_before: int) -> int:
    """Attention work of one prefill chunk: new_tokens x (context_before + new_tokens / 2)."""
    if num_new_tokens <= 0:
        return 0
    return num_new_tokens * (2 * num_context_before + num_new_tokens) // 2


def chunked_attention(num_new_tokens: int, num_cached_tokens: int, chunk_tokens: int) -> int:
    """prefill_attention summed over the chunks of a prefill (each chunk at most chunk_tokens,
    its context the cached prefix plus the chunks before it), in closed form: the chunks' sizes
    n_i sum to N, and sum n_i x (2 x context_i + n_i) = 2 x N x cached + N^2 whatever the split;
    each chunk's halving rounds down, by 1/2 for an odd chunk."""
    n = num_new_tokens
    if n <= 0:
        return 0
    steps = -(-n // chunk_tokens)
    last = n - (steps - 1) * chunk_tokens
    num_odd = (steps - 1) * (chunk_tokens % 2) + last % 2
    return (2 * n * num_cached_tokens + n * n - num_odd) // 2


@dataclass(frozen=True, slots=True)
class StepSample:
    prefill_tokens: int
    prefill_attention: int
    decode_seqs: int
    decode_context_tokens: int
    seconds: float

    def features(self) -> tuple[float, float, float, float, float]:
        return (1.0, float(self.prefill_tokens), float(self.prefill_attention), float(self.decode_seqs), float(self.decode_context_tokens))


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    coefficients: tuple[float, ...]  # c0..c4, see the module docstring
    num_samples: int
    mean_abs_pct_error: float
    seeded_from_profile: bool = False
    # The kink: prefill tokens a step computes within its memory-bound time, at no cost of their
    # own (c1 prices only those past it, per step). 0: a straight line (a CPU, or no kink seen).
    free_prefill_tokens: float = 0.0

    def step_seconds(
        self, prefill_tokens: int = 0, prefill_attention: int = 0, decode_seqs: int = 0, decode_context_tokens: int = 0
    ) -> float:
        c = self.coefficients
        hinge = prefill_hinge(prefill_tokens, self.free_prefill_tokens)
        t = c[0] + c[1] * hinge + c[2] * prefill_attention + c[3] * decode_seqs + c[4] * decode_context_tokens
        return max(t, 0.0)

    def prefill_seconds(self, num_new_tokens: int, num_cached_tokens: int, chunk_tokens: int) -> float:
        """A prompt's prefill run alone: num_new_tokens after num_cached_tokens of cached prefix, in
        steps of at most chunk_tokens (the engine's max_num_batched_tokens)."""
        return self.chunked_prefill_seconds(num_new_tokens, num_cached_tokens, chunk_tokens)

    def chunked_prefill_seconds(
        self, num_new_tokens: int, num_cached_tokens: int, chunk_tokens: int, decode_seqs: int = 0, decode_context_tokens: int = 0
    ) -> float:
        """The engine steps that prefill num_new_tokens after num_cached_tokens, at most
        chunk_tokens per step, each step also carrying decode_seqs running decodes of
        decode_context_tokens in all: the sum of step_seconds over the chunks, in closed form
        (the model is linear past its kink, so the sum is steps x the per-step terms + c1 x the
        chunks' tokens past the kink, chunked_hinge, + c2 x their total attention, chunked_attention)."""
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        if num_new_tokens <= 0:
            return 0.0
        c = self.coefficients
        steps = -(-num_new_tokens // chunk_tokens)
        per_step = c[0] + c[3] * decode_seqs + c[4] * decode_context_tokens
        return steps * per_step + self.prefill_work_seconds(num_new_tokens, num_cached_tokens, chunk_tokens)

    def prefill_work_seconds(self, num_new_tokens: int, num_cached_tokens: int, chunk_tokens: int) -> float:
        """What a prefill adds to the steps that carry it, beyond their own cost: c1 x its tokens
        past each step's kink + c2 x its attention. The seconds it takes from every request
        sharing those steps (a decode slowed by a co-scheduled chunk)."""
        return self._work_seconds(num_new_tokens, num_cached_tokens, chunk_tokens, self.free_prefill_tokens)

    def stream_work_seconds(self, num_new_tokens: int, num_cached_tokens: int, chunk_tokens: int) -> float:
        """A prefill's work as one of a stream of prompts sharing a worker's steps: c1 x all its
        tokens + c2 x its attention. The kink is a step's, not a prompt's: prompts arriving
        together fill a step's free tokens once (slack_seconds), so a prompt shorter than the kink
        still adds its tokens to what the steps carry."""
        return self._work_seconds(num_new_tokens, num_cached_tokens, chunk_tokens, 0.0)

    def _work_seconds(self, num_new_tokens: int, num_cached_tokens: int, chunk_tokens: int, free_tokens: float) -> float:
        if num_new_tokens <= 0:
            return 0.0
        c = self.coefficients
        hinge = chunked_hinge(num_new_tokens, chunk_tokens, free_tokens)
        return c[1] * hinge + c[2] * chunked_attention(num_new_tokens, num_cached_tokens, chunk_tokens)

    @property
    def slack_seconds(self) -> float:
        """The prefill work one step absorbs at no cost of its own (c1 x the kink)."""
        return self.coefficients[1] * self.free_prefill_tokens

    def decode_step_seconds(self, batch_size: int, context_tokens: int) -> float:
        """One decode step of batch_size sequences holding context_tokens tokens in all."""
        if batch_size <= 0:
            return 0.0
        return self.step_seconds(decode_seqs=batch_size, decode_context_tokens=context_tokens)

    def to_pb(self) -> common_pb2.LatencyModel:
        from kvplane.v1 import common_pb2

        return common_pb2.LatencyModel(
            coefficients=list(self.coefficients),
            num_samples=self.num_samples,
            mean_abs_pct_error=self.mean_abs_pct_error,
            seeded_from_profile=self.seeded_from_profile,
            free_prefill_tokens=self.free_prefill_tokens,
        )

    @classmethod
    def from_pb(cls, msg: common_pb2.LatencyModel) -> StepTimeModel | None:
        """None for an unset or malformed message (wrong number of coefficients, NaN, negative)."""
        coefficients = tuple(float(c) for c in msg.coefficients)
        free = float(msg.free_prefill_tokens)
        if len(coefficients) != NUM_COEFFICIENTS or not all(math.isfinite(c) and c >= 0 for c in (*coefficients, free)):
            return None
        return cls(coefficients, msg.num_samples, msg.mean_abs_pct_error, msg.seeded_from_profile, free)


# --- fitting ---------------------------------------------------------------------------------


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _least_squares(rows: list[tuple[float, ...]], ys: list[float], weights: list[float], active: list[int]) -> list[float] | None:
    """Weighted least-squares coefficients for the active columns, by the normal equations + ridge."""
    k = len(active)
    ata = [[0.0] * k for _ in range(k)]
    aty = [0.0] * k
    for row, y, w in zip(rows, ys, weights):
        x = [row[j] for j in active]
        for i in range(k):
            xi = x[i] * w
            if xi:
                aty[i] += xi * y
                ata_i = ata[i]
                for j in range(i, k):
                    ata_i[j] += xi * x[j]
    for i in range(k):
        for j in range(i):
            ata[i][j] = ata[j][i]
        ata[i][i] += RIDGE * max(ata[i][i], 1.0)
    return _solve(ata, aty)


def fit(
    samples: Sequence[StepSample], *, seeded_from_profile: bool = False, kinks: Sequence[int] = KINK_CANDIDATES
) -> StepTimeModel | None:
    """Least-squares step-time model with non-negative coefficients; None below MIN_SAMPLES.
    The kink (free_prefill_tokens) is the one of `kinks` whose fit has the least error, kept only
    if that error is under KINK_GAIN x the straight line's."""
    if len(samples) < MIN_SAMPLES:
        return None
    coefficients, line_error = _fit_at(samples, 0.0)
    free, error = 0.0, line_error
    longest = max(s.prefill_tokens for s in samples)
    for k in kinks:
        if k >= longest:
            break
        c, e = _fit_at(samples, float(k))
        if e < KINK_GAIN * line_error and e < error:
            coefficients, free, error = c, float(k), e
    return StepTimeModel(coefficients, len(samples), error, seeded_from_profile, free)


def _fit_at(samples: Sequence[StepSample], free: float) -> tuple[tuple[float, ...], float]:
    """(coefficients, mean relative error) of the fit with the kink at `free` prefill tokens: the
    least squares, then the robust pass (module docstring)."""
    coefficients = _fit_coefficients(samples, free)
    errors = _relative_errors(coefficients, samples, free)
    if errors:
        limit = max(OUTLIER_MIN, OUTLIER_MADS * sorted(errors)[len(errors) // 2])
        sizes = Counter(_prefill_bucket(s) for s in samples)
        kept = [
            s for s in samples
            if s.seconds <= 0 or abs(_predict(coefficients, s, free) - s.seconds) <= limit * s.seconds or sizes[_prefill_bucket(s)] <= OUTLIER_PEERS
        ]  # fmt: skip
        if MIN_SAMPLES <= len(kept) < len(samples):
            coefficients = _fit_coefficients(kept, free)
            errors = _relative_errors(coefficients, samples, free)
    return coefficients, (sum(errors) / len(errors) if errors else 0.0)


def _fit_coefficients(samples: Sequence[StepSample], free: float = 0.0) -> tuple[float, ...]:
    raw = [_features(s, free) for s in samples]
    ys = [float(s.seconds) for s in samples]
    scales = [1.0] * NUM_COEFFICIENTS
    active = [0]
    for j in range(1, NUM_COEFFICIENTS):
        column = [r[j] for r in raw]
        lo, hi = min(column), max(column)
        if hi > lo:  # a constant feature is indistinguishable from c0
            scales[j] = max(abs(lo), abs(hi))
            active.append(j)
    rows = [tuple(r[j] / scales[j] for j in range(NUM_COEFFICIENTS)) for r in raw]
    floor = sorted(ys)[len(ys) // 20]
    if floor <= 0:
        floor = max(max(ys), 1e-9) * 1e-3
    weights = [1.0 / max(y, floor) ** 2 for y in ys]
    # No step shape weighs as more than `cap` steps (module docstring).
    shapes = [_shape(s) for s in samples]
    counts = Counter(shapes)
    cap = max(SHAPE_CAP_MIN, 2 * len(samples) / len(counts))
    weights = [w * min(counts[shape], cap) / counts[shape] for shape, w in zip(shapes, weights)]
    scaled = [0.0] * NUM_COEFFICIENTS
    while active:
        solution = _least_squares(rows, ys, weights, active)
        if solution is None:  # cannot happen with the ridge; fall back to no terms rather than fail
            break
        negative = [(v, j) for v, j in zip(solution, active) if v < 0]
        if not negative:
            for v, j in zip(solution, active):
                scaled[j] = v
            break
        active.remove(min(negative)[1])  # drop the most negative and refit
    return tuple(scaled[j] / scales[j] for j in range(NUM_COEFFICIENTS))


def _prefill_bucket(s: StepSample) -> int:
    """0 for no prefill, else 1 + floor(log2(prefill tokens)): steps of one bucket are alike."""
    return s.prefill_tokens.bit_length()


def _shape(s: StepSample) -> tuple[int, int]:
    return _prefill_bucket(s), s.decode_seqs.bit_length()


def _features(s: StepSample, free: float) -> tuple[float, ...]:
    f = s.features()
    return f if not free else (f[0], prefill_hinge(s.prefill_tokens, free), *f[2:])


def _predict(c: Sequence[float], s: StepSample, free: float = 0.0) -> float:
    return max(sum(ci * xi for ci, xi in zip(c, _features(s, free))), 0.0)


def _relative_errors(c: Sequence[float], samples: Sequence[StepSample], free: float = 0.0) -> list[float]:
    return [abs(_predict(c, s, free) - s.seconds) / s.seconds for s in samples if s.seconds > 0]


class OnlineStepModel:
    """A step-time model refitted from the worker's recent steps, on top of a profile seed.

    The window holds the last `window` samples that are at most `max_age_s` old; the seed (a
    profile) is kept apart so live traffic never evicts it, and a new profile replaces it. Old
    samples age out so an idle worker returns to its profile: otherwise steps measured in a past
    overload would keep predicting overload, admission would reject everything, and no new step
    would ever correct them. model() refits lazily: once `refit_every` new samples have arrived
    (at most once per `min_interval_s`), when samples aged out, or at once when the seed changed.
    """

    def __init__(
        self,
        window: int = 512,
        refit_every: int = 16,
        *,
        min_interval_s: float = 0.0,
        max_age_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window < MIN_SAMPLES or refit_every <= 0 or min_interval_s < 0 or max_age_s <= 0:
            raise ValueError(f"window must be at least {MIN_SAMPLES}, refit_every and max_age_s positive and min_interval_s >= 0")
        self._window: deque[tuple[float, StepSample]] = deque(maxlen=window)
        self._seed: list[StepSample] = []
        self._refit_every = refit_every
        self._min_interval_s = min_interval_s  # a fit of ~1,000 samples costs ~15 ms of pure Python
        self._max_age_s = max_age_s
        self._clock = clock
        self._fitted_at = -math.inf
        self._num_new = 0
        self._stale = True
        self._model: StepTimeModel | None = None

    @property
    def num_samples(self) -> int:
        return len(self._seed) + len(self._window)

    def seed(self, profile_samples: Sequence[StepSample]) -> None:
        self._seed = list(profile_samples)
        self._stale = True

    def add(self, samples: Sequence[StepSample]) -> None:
        if samples:
            now = self._clock()
            self._window.extend((now, sample) for sample in samples)
            self._num_new += len(samples)

    def model(self) -> StepTimeModel | None:
        now = self._clock()
        expired = False
        while self._window and now - self._window[0][0] > self._max_age_s:
            self._window.popleft()
            expired = True
        due = self._num_new >= self._refit_every and now - self._fitted_at >= self._min_interval_s
        if self._stale or due or expired or (self._model is None and self._num_new):
            samples = [*self._seed, *(sample for _, sample in self._window)]
            enough = bool(self._seed) or len(samples) >= MIN_ONLINE_SAMPLES
            self._model = fit(samples, seeded_from_profile=bool(self._seed)) if enough else None
            self._fitted_at = now
            self._num_new = 0
            self._stale = False
        return self._model


# --- protobuf --------------------------------------------------------------------------------


def sample_to_pb(s: StepSample) -> common_pb2.StepTiming:
    from kvplane.v1 import common_pb2

    return common_pb2.StepTiming(
        prefill_tokens=s.prefill_tokens,
        prefill_attention=s.prefill_attention,
        decode_seqs=s.decode_seqs,
        decode_context_tokens=s.decode_context_tokens,
        seconds=s.seconds,
    )


def sample_from_pb(msg: common_pb2.StepTiming) -> StepSample:
    return StepSample(msg.prefill_tokens, msg.prefill_attention, msg.decode_seqs, msg.decode_context_tokens, msg.seconds)


def samples_to_pb(samples: Sequence[StepSample], measured_at: float) -> common_pb2.LatencyProfile:
    from kvplane.v1 import common_pb2

    return common_pb2.LatencyProfile(samples=[sample_to_pb(s) for s in samples], measured_at=measured_at)


def samples_from_pb(profile: common_pb2.LatencyProfile) -> list[StepSample]:
    return [sample_from_pb(m) for m in profile.samples]

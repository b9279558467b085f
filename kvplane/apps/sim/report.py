"""The rows a simulated run reports: the benchmarks' own (kvplane bench load and bench prefix).

- From `kvplane bench load` (its `summarize`, the same function): offered_rps, admitted, rejected,
  goodput_rps (requests meeting both objectives of their priority / duration), attainment (of
  admitted), TTFT and TPOT p50/p99, ttft_prediction_error. TTFT counts from the moment the request
  reached the control plane to its first token there; TPOT = (last - first token) / (tokens - 1).
- From `kvplane bench prefix`: hit_rate (prompt tokens not computed where the prompt was prefilled
  / prompt tokens), oracle_hit_rate (kvplane.apps.sim.simulator.OracleCache, every tier's capacity),
  infinite_hit_rate (the same cache never evicting: the trace's own bound), prefill_tokens computed,
  max_load_over_mean (per worker: prompt tokens computed + tokens generated; max over the mean).
- Hits by tier: hit_device, hit_host, hit_disk (the tokens each tier supplied / prompt tokens;
  they add up to hit_rate).
- Also: failed, disaggregated and fetch counts, kv_bytes_moved, throughput_tok_s, duration_s, and
  the virtual duration over which offered_rps and goodput are taken (`window_s`: the arrival window).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvplane.apps.bench.load import Outcome, summarize
from kvplane.apps.sim.simulator import Record, RunResult
from kvplane.stats import percentile
from kvplane.types import Objective


def outcomes(records: Sequence[Record]) -> list[Outcome]:
    out = []
    for r in records:
        if not r.admitted:
            out.append(Outcome(r.priority, admitted=False))
            continue
        ttft = r.ttft_s
        predicted = r.predicted_ttft_s * 1000 if r.predicted_ttft_s is not None else 0.0
        if r.failed or ttft is None:
            out.append(Outcome(r.priority, admitted=True, ttft_s=ttft or 0.0, num_tokens=r.num_tokens, failed=True))
            continue
        out.append(Outcome(r.priority, True, ttft, r.tpot_s, r.num_tokens, predicted))
    return out


def row(result: RunResult, window_s: float, objectives: Mapping[str, Objective]) -> dict[str, Any]:
    """The row of one simulated run; `window_s`: the seconds over which requests arrived."""
    loads = [w.num_prefill_tokens + w.num_generated_tokens for w in result.workers]
    return records_row(result.records, loads, result.duration_s, window_s, objectives)


def records_row(
    records: Sequence[Record], loads: Sequence[int], duration_s: float, window_s: float, objectives: Mapping[str, Objective]
) -> dict[str, Any]:
    """The row of any run's records (simulated, or replayed on real processes: replay.py);
    `loads`: per worker, prompt tokens computed + tokens generated."""
    base = summarize(outcomes(records), window_s, dict(objectives))
    prompt = sum(r.prompt_tokens for r in records if r.admitted and not r.failed)
    cached = sum(r.cached_tokens for r in records if r.admitted and not r.failed)
    routed_prompt = sum(r.prompt_tokens for r in records if r.admitted or r.rejected)
    oracle = sum(r.oracle_cached_tokens for r in records)
    infinite = sum(r.infinite_cached_tokens for r in records)
    loaded = sum(r.loaded_tokens for r in records if r.admitted and not r.failed)
    from_disk = sum(r.disk_loaded_tokens for r in records if r.admitted and not r.failed)
    mean = sum(loads) / len(loads) if loads else 0.0
    generated = sum(r.num_tokens for r in records)
    base.update(
        {
            "requests": len(records),
            "failed": sum(r.failed for r in records),
            "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
            "hit_device": round((cached - loaded) / prompt, 4) if prompt else 0.0,
            "hit_host": round((loaded - from_disk) / prompt, 4) if prompt else 0.0,
            "hit_disk": round(from_disk / prompt, 4) if prompt else 0.0,
            "oracle_hit_rate": round(oracle / routed_prompt, 4) if routed_prompt else 0.0,
            "infinite_hit_rate": round(infinite / routed_prompt, 4) if routed_prompt else 0.0,
            "prefill_tokens": prompt - cached,
            "max_load_over_mean": round(max(loads) / mean, 4) if mean else 0.0,
            "disaggregated": sum(r.disaggregated for r in records if r.admitted),
            "fetches": sum(r.fetched for r in records),
            "kv_bytes_moved": sum(r.kv_transfer_bytes for r in records),
            "throughput_tok_s": round((prompt + generated) / duration_s, 1) if duration_s > 0 else 0.0,
            "window_s": round(window_s, 3),
            "duration_s": round(duration_s, 3),
        }
    )
    return base


def planner_cost(result: RunResult, num_workers: int) -> dict[str, Any]:
    """Wall-clock microseconds the planner spent per request (route + admit), p50/p99/max."""
    us = [s * 1e6 for s in result.planner_cost_s]
    return {
        "decisions": len(us),
        "p50_us": round(percentile(us, 50) or 0.0, 1),
        "p99_us": round(percentile(us, 99) or 0.0, 1),
        "max_us": round(max(us, default=0.0), 1),
        "workers": num_workers,
        "index_block_hashes": result.index_blocks,
        "index_entries": result.index_entries,
    }

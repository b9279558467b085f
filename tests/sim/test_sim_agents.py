"""Sim-engine agents in real processes: KV crosses the real transport with a scaled-down payload
and reports the modeled bytes and link time; greedy tokens match wherever the request ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvplane import Client, hardware
from kvplane.apps.cluster import LocalCluster, free_port
from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.latency import prefill_attention

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]

SIM_ARGS = ("--engine", "sim", "--sim-model", "llama-3-8b", "--sim-gpu", "h100", "--sim-tp", "1", "--sim-link", "100gbe")


def test_a_disaggregated_request_moves_the_modeled_kv_over_the_modeled_link():
    prompt = list(range(1, 2001))  # 125 full blocks of 16 tokens
    with LocalCluster(num_prefill=1, num_decode=1, agent_args=SIM_ARGS) as cluster, Client(cluster.endpoint, timeout=30) as client:
        remote = client.generate(prompt, max_tokens=6, disagg="always")
        local = client.generate(list(range(3, 2003)), max_tokens=6, disagg="never")
        again = client.generate(prompt, max_tokens=6, disagg="never")
    m = remote.metrics
    block_bytes = hardware.model("llama-3-8b").layout(16).block_nbytes
    assert m.disaggregated and m.transport == "grpc" and m.kv_transfer_blocks == 125
    assert m.kv_transfer_bytes == 125 * block_bytes == 262_144_000
    modeled_ms = hardware.link("100gbe").transfer_seconds(262_144_000) * 1000  # 21 ms
    assert modeled_ms <= m.kv_transfer_ms < modeled_ms + 1000
    # The decode worker now holds the prompt: run there without a transfer, same greedy tokens.
    assert again.metrics.decode_worker == "decode-0" and again.metrics.cached_tokens == 1984
    assert again.token_ids == remote.token_ids and local.token_ids != remote.token_ids


def test_kvplane_up_starts_sim_workers_whose_time_runs_at_the_speedup(tmp_path):
    """`kvplane up --engine NAME` forwards the engine's flags; --speedup 0.5 runs simulated time at
    half speed, so a prefill takes twice its simulated time in wall time."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    up = subprocess.Popen(
        [sys.executable, "-m", "kvplane", "up", "--port", str(port), "--prefill", "1", "--decode", "3", "--engine", "sim",
         "--sim-model", "llama-3-8b", "--sim-tp", "1", "--speedup", "0.5", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        first_line = up.stdout.readline()
        assert first_line.startswith("kvplane cluster ready"), first_line + (up.stderr.read() if up.poll() is not None else "")
        with Client(f"127.0.0.1:{port}", timeout=30) as client:
            workers = client.workers()
            result = client.generate(list(range(1, 4001)), max_tokens=2, disagg="never")
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
    assert sorted(w.worker_id for w in workers) == ["decode-0", "decode-1", "decode-2", "prefill-0"]
    assert {w.model for w in workers} == {"llama-3-8b"}
    roofline = SimConfig(model="llama-3-8b", tp=1).roofline_model()
    prefill_s = roofline.step_seconds(4000, prefill_attention(4000, 0))  # one chunk: 4,000 <= 8,192 tokens
    assert 2 * prefill_s * 1000 <= result.metrics.ttft_ms < 2 * prefill_s * 1000 + 1500


def test_kvplane_sim_prints_json_rows_and_refuses_bad_hardware_in_one_line():
    from tests.cli.conftest import run_kvplane

    done = run_kvplane("sim", "--workload", "chat", "--both", "2", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["config"]["model"] == "llama-3-8b" and len(result["rows"]) == 1 and result["rows"][0]["requests"] == 96
    assert "[chat x1 kvplane/threshold] done" in done.stderr  # progress goes to stderr
    bad = run_kvplane("sim", "--sim-gpu", "tpu-v9")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("kvplane sim: unknown gpu 'tpu-v9'; known: a100-80g")

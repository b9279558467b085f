from kvplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "text", "token_ids", "chat", "sampling", "disagg", "request_id", "cache_salt", "priority", "max_tokens_to_limit", "stream_interval", "resume_token_ids", "lookaside")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DISAGG_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_TO_LIMIT_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOOKASIDE_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    token_ids: TokenIds
    chat: ChatPrompt
    sampling: _common_pb2.SamplingParams
    disagg: _common_pb2.DisaggMode
    request_id: str
    cache_salt: str
    priority: str
    max_tokens_to_limit: bool
    stream_interval: int
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    lookaside: bool
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., chat: _Optional[_Union[ChatPrompt, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., disagg: _Optional[_Union[_common_pb2.DisaggMode, str]] = ..., request_id: _Optional[str] = ..., cache_salt: _Optional[str] = ..., priority: _Optional[str] = ..., max_tokens_to_limit: _Optional[bool] = ..., stream_interval: _Optional[int] = ..., resume_token_ids: _Optional[_Iterable[int]] = ..., lookaside: _Optional[bool] = ...) -> None: ...

class ChatPrompt(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "text", "finished", "finish_reason", "metrics", "request_id")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finished: bool
    finish_reason: str
    metrics: _common_pb2.RequestMetrics
    request_id: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., metrics: _Optional[_Union[_common_pb2.RequestMetrics, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("request_id", "decode_worker", "prefill_worker", "disaggregated", "reason", "prompt_tokens", "cached_tokens", "candidates", "fetch_from", "placement")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    FETCH_FROM_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    decode_worker: str
    prefill_worker: str
    disaggregated: bool
    reason: str
    prompt_tokens: int
    cached_tokens: int
    candidates: _containers.RepeatedCompositeFieldContainer[CandidateScore]
    fetch_from: str
    placement: Placement
    def __init__(self, request_id: _Optional[str] = ..., decode_worker: _Optional[str] = ..., prefill_worker: _Optional[str] = ..., disaggregated: _Optional[bool] = ..., reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., candidates: _Optional[_Iterable[_Union[CandidateScore, _Mapping]]] = ..., fetch_from: _Optional[str] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("placement_id", "worker_id", "endpoint", "agent_request", "ticket_expires_in_s", "first_token_timeout_s", "token_timeout_s", "metrics", "num_resumed_tokens")
    PLACEMENT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    TICKET_EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    NUM_RESUMED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    placement_id: str
    worker_id: str
    endpoint: str
    agent_request: bytes
    ticket_expires_in_s: float
    first_token_timeout_s: float
    token_timeout_s: float
    metrics: _common_pb2.RequestMetrics
    num_resumed_tokens: int
    def __init__(self, placement_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., agent_request: _Optional[bytes] = ..., ticket_expires_in_s: _Optional[float] = ..., first_token_timeout_s: _Optional[float] = ..., token_timeout_s: _Optional[float] = ..., metrics: _Optional[_Union[_common_pb2.RequestMetrics, _Mapping]] = ..., num_resumed_tokens: _Optional[int] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("placement_id", "event", "metrics", "ttft_ms", "tpot_ms", "num_tokens", "token_ids", "failure_code", "failure_details", "stalled", "traceparent")
    class Event(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        EVENT_UNSPECIFIED: _ClassVar[ReportRequest.Event]
        FIRST_TOKEN: _ClassVar[ReportRequest.Event]
        FINISHED: _ClassVar[ReportRequest.Event]
        FAILED: _ClassVar[ReportRequest.Event]
        CANCELLED: _ClassVar[ReportRequest.Event]
        PREFILL_DONE: _ClassVar[ReportRequest.Event]
    EVENT_UNSPECIFIED: ReportRequest.Event
    FIRST_TOKEN: ReportRequest.Event
    FINISHED: ReportRequest.Event
    FAILED: ReportRequest.Event
    CANCELLED: ReportRequest.Event
    PREFILL_DONE: ReportRequest.Event
    PLACEMENT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CODE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_DETAILS_FIELD_NUMBER: _ClassVar[int]
    STALLED_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    placement_id: str
    event: ReportRequest.Event
    metrics: _common_pb2.RequestMetrics
    ttft_ms: float
    tpot_ms: float
    num_tokens: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    failure_code: str
    failure_details: str
    stalled: bool
    traceparent: str
    def __init__(self, placement_id: _Optional[str] = ..., event: _Optional[_Union[ReportRequest.Event, str]] = ..., metrics: _Optional[_Union[_common_pb2.RequestMetrics, _Mapping]] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., num_tokens: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., failure_code: _Optional[str] = ..., failure_details: _Optional[str] = ..., stalled: _Optional[bool] = ..., traceparent: _Optional[str] = ...) -> None: ...

class ReportAnswer(_message.Message):
    __slots__ = ("placement_id", "code", "message")
    PLACEMENT_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    placement_id: str
    code: int
    message: str
    def __init__(self, placement_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("next",)
    NEXT_FIELD_NUMBER: _ClassVar[int]
    next: Placement
    def __init__(self, next: _Optional[_Union[Placement, _Mapping]] = ...) -> None: ...

class CandidateScore(_message.Message):
    __slots__ = ("worker_id", "cost", "cached_tokens", "admissible", "note")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADMISSIBLE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    cost: float
    cached_tokens: int
    admissible: bool
    note: str
    def __init__(self, worker_id: _Optional[str] = ..., cost: _Optional[float] = ..., cached_tokens: _Optional[int] = ..., admissible: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("info", "load", "load_age_s", "out_of_routing")
    INFO_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LOAD_AGE_S_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_ROUTING_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.WorkerInfo
    load: _common_pb2.WorkerLoad
    load_age_s: float
    out_of_routing: str
    def __init__(self, info: _Optional[_Union[_common_pb2.WorkerInfo, _Mapping]] = ..., load: _Optional[_Union[_common_pb2.WorkerLoad, _Mapping]] = ..., load_age_s: _Optional[float] = ..., out_of_routing: _Optional[str] = ...) -> None: ...

class GetCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCacheResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerCache]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerCache, _Mapping]]] = ...) -> None: ...

class WorkerCache(_message.Message):
    __slots__ = ("worker_id", "blocks_by_tier", "num_pinned_blocks")
    class BlocksByTierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    NUM_PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    blocks_by_tier: _containers.ScalarMap[str, int]
    num_pinned_blocks: int
    def __init__(self, worker_id: _Optional[str] = ..., blocks_by_tier: _Optional[_Mapping[str, int]] = ..., num_pinned_blocks: _Optional[int] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DrainWorkerResponse(_message.Message):
    __slots__ = ("worker_id", "state")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    state: _common_pb2.WorkerState
    def __init__(self, worker_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ...) -> None: ...

class ProfileWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "max_prompt_tokens", "max_batch")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    max_prompt_tokens: int
    max_batch: int
    def __init__(self, worker_id: _Optional[str] = ..., max_prompt_tokens: _Optional[int] = ..., max_batch: _Optional[int] = ...) -> None: ...

class ProfileWorkerResponse(_message.Message):
    __slots__ = ("worker_id", "model", "num_samples")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: _common_pb2.LatencyModel
    num_samples: int
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[_Union[_common_pb2.LatencyModel, _Mapping]] = ..., num_samples: _Optional[int] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetConfigRequest(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ConfigResponse(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, str]
    def __init__(self, values: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("window_s",)
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    window_s: float
    def __init__(self, window_s: _Optional[float] = ...) -> None: ...

class LatencySummary(_message.Message):
    __slots__ = ("count", "mean_ms", "p50_ms", "p90_ms", "p99_ms")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_MS_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P90_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    def __init__(self, count: _Optional[int] = ..., mean_ms: _Optional[float] = ..., p50_ms: _Optional[float] = ..., p90_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ...) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("worker_id", "num_requests", "ttft", "itl", "prompt_tokens", "cached_tokens", "kv_transfer_bytes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TTFT_FIELD_NUMBER: _ClassVar[int]
    ITL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    num_requests: int
    ttft: LatencySummary
    itl: LatencySummary
    prompt_tokens: int
    cached_tokens: int
    kv_transfer_bytes: int
    def __init__(self, worker_id: _Optional[str] = ..., num_requests: _Optional[int] = ..., ttft: _Optional[_Union[LatencySummary, _Mapping]] = ..., itl: _Optional[_Union[LatencySummary, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., kv_transfer_bytes: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("workers", "window_s", "metrics_url")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStats]
    window_s: float
    metrics_url: str
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStats, _Mapping]]] = ..., window_s: _Optional[float] = ..., metrics_url: _Optional[str] = ...) -> None: ...

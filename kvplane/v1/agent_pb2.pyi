from kvplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillSource(_message.Message):
    __slots__ = ("worker_id", "endpoint", "transport", "cached_only")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    CACHED_ONLY_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    endpoint: str
    transport: str
    cached_only: bool
    def __init__(self, worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., transport: _Optional[str] = ..., cached_only: _Optional[bool] = ...) -> None: ...

class AgentGenerateRequest(_message.Message):
    __slots__ = ("ticket", "request_id", "prompt_token_ids", "sampling", "cache_salt", "prefill_from", "num_resumed_tokens", "stream_interval", "tokens_only", "report_prefill_done")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FROM_FIELD_NUMBER: _ClassVar[int]
    NUM_RESUMED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_ONLY_FIELD_NUMBER: _ClassVar[int]
    REPORT_PREFILL_DONE_FIELD_NUMBER: _ClassVar[int]
    ticket: _common_pb2.Ticket
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    cache_salt: str
    prefill_from: PrefillSource
    num_resumed_tokens: int
    stream_interval: int
    tokens_only: bool
    report_prefill_done: bool
    def __init__(self, ticket: _Optional[_Union[_common_pb2.Ticket, _Mapping]] = ..., request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., cache_salt: _Optional[str] = ..., prefill_from: _Optional[_Union[PrefillSource, _Mapping]] = ..., num_resumed_tokens: _Optional[int] = ..., stream_interval: _Optional[int] = ..., tokens_only: _Optional[bool] = ..., report_prefill_done: _Optional[bool] = ...) -> None: ...

class AgentGenerateResponse(_message.Message):
    __slots__ = ("token_ids", "text", "finished", "finish_reason", "metrics", "remote_prefill_done")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PREFILL_DONE_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finished: bool
    finish_reason: str
    metrics: _common_pb2.RequestMetrics
    remote_prefill_done: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., metrics: _Optional[_Union[_common_pb2.RequestMetrics, _Mapping]] = ..., remote_prefill_done: _Optional[bool] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("ticket", "request_id", "prompt_token_ids", "cache_salt", "layout", "transports", "decode_agent_name", "decode_transport_metadata", "cached_only", "transfer_id")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    DECODE_AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    DECODE_TRANSPORT_METADATA_FIELD_NUMBER: _ClassVar[int]
    CACHED_ONLY_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    ticket: _common_pb2.Ticket
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    cache_salt: str
    layout: _common_pb2.KVLayout
    transports: _containers.RepeatedScalarFieldContainer[str]
    decode_agent_name: str
    decode_transport_metadata: bytes
    cached_only: bool
    transfer_id: str
    def __init__(self, ticket: _Optional[_Union[_common_pb2.Ticket, _Mapping]] = ..., request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., transports: _Optional[_Iterable[str]] = ..., decode_agent_name: _Optional[str] = ..., decode_transport_metadata: _Optional[bytes] = ..., cached_only: _Optional[bool] = ..., transfer_id: _Optional[str] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("transfer_id", "block_hashes", "prefill_computed_tokens", "cached_tokens", "transport", "transport_descriptor", "expires_at", "layout", "block_digests")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    prefill_computed_tokens: int
    cached_tokens: int
    transport: str
    transport_descriptor: bytes
    expires_at: float
    layout: _common_pb2.KVLayout
    block_digests: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, transfer_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., prefill_computed_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., transport: _Optional[str] = ..., transport_descriptor: _Optional[bytes] = ..., expires_at: _Optional[float] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., block_digests: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PullKVRequest(_message.Message):
    __slots__ = ("transfer_id", "block_indices", "layout", "chunk_bytes", "release_after", "ticket")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDICES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_AFTER_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    block_indices: _containers.RepeatedScalarFieldContainer[int]
    layout: _common_pb2.KVLayout
    chunk_bytes: int
    release_after: bool
    ticket: _common_pb2.Ticket
    def __init__(self, transfer_id: _Optional[str] = ..., block_indices: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., chunk_bytes: _Optional[int] = ..., release_after: _Optional[bool] = ..., ticket: _Optional[_Union[_common_pb2.Ticket, _Mapping]] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("block_index", "offset", "data")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    offset: int
    data: bytes
    def __init__(self, block_index: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReleaseKVRequest(_message.Message):
    __slots__ = ("transfer_id", "ticket")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    ticket: _common_pb2.Ticket
    def __init__(self, transfer_id: _Optional[str] = ..., ticket: _Optional[_Union[_common_pb2.Ticket, _Mapping]] = ...) -> None: ...

class ReleaseKVResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: _common_pb2.Ticket
    def __init__(self, ticket: _Optional[_Union[_common_pb2.Ticket, _Mapping]] = ...) -> None: ...

class UndrainRequest(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: _common_pb2.Ticket
    def __init__(self, ticket: _Optional[_Union[_common_pb2.Ticket, _Mapping]] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("state", "num_running")
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.WorkerState
    num_running: int
    def __init__(self, state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., num_running: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("info", "load")
    INFO_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.WorkerInfo
    load: _common_pb2.WorkerLoad
    def __init__(self, info: _Optional[_Union[_common_pb2.WorkerInfo, _Mapping]] = ..., load: _Optional[_Union[_common_pb2.WorkerLoad, _Mapping]] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ("max_prompt_tokens", "max_batch", "ticket")
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    max_prompt_tokens: int
    max_batch: int
    ticket: _common_pb2.Ticket
    def __init__(self, max_prompt_tokens: _Optional[int] = ..., max_batch: _Optional[int] = ..., ticket: _Optional[_Union[_common_pb2.Ticket, _Mapping]] = ...) -> None: ...

class ProfileResponse(_message.Message):
    __slots__ = ("profile", "model")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    profile: _common_pb2.LatencyProfile
    model: _common_pb2.LatencyModel
    def __init__(self, profile: _Optional[_Union[_common_pb2.LatencyProfile, _Mapping]] = ..., model: _Optional[_Union[_common_pb2.LatencyModel, _Mapping]] = ...) -> None: ...

from kvplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("info", "ttl_seconds")
    INFO_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.WorkerInfo
    ttl_seconds: int
    def __init__(self, info: _Optional[_Union[_common_pb2.WorkerInfo, _Mapping]] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("worker_id", "lease_id", "ttl_seconds", "profile", "ticket_public_key", "session_token", "bus_url")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TICKET_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BUS_URL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_id: int
    ttl_seconds: int
    profile: _common_pb2.LatencyProfile
    ticket_public_key: bytes
    session_token: bytes
    bus_url: str
    def __init__(self, worker_id: _Optional[str] = ..., lease_id: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., profile: _Optional[_Union[_common_pb2.LatencyProfile, _Mapping]] = ..., ticket_public_key: _Optional[bytes] = ..., session_token: _Optional[bytes] = ..., bus_url: _Optional[str] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("worker_id", "lease_id", "session_token", "keepalive_seq")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_SEQ_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_id: int
    session_token: bytes
    keepalive_seq: int
    def __init__(self, worker_id: _Optional[str] = ..., lease_id: _Optional[int] = ..., session_token: _Optional[bytes] = ..., keepalive_seq: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("ttl_seconds", "snapshot_requested")
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: int
    snapshot_requested: bool
    def __init__(self, ttl_seconds: _Optional[int] = ..., snapshot_requested: _Optional[bool] = ...) -> None: ...

class ReportLoadRequest(_message.Message):
    __slots__ = ("worker_id", "lease_id", "load", "state", "latency", "session_token", "kv_seq", "report_seq")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPORT_SEQ_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_id: int
    load: _common_pb2.WorkerLoad
    state: _common_pb2.WorkerState
    latency: _common_pb2.LatencyModel
    session_token: bytes
    kv_seq: int
    report_seq: int
    def __init__(self, worker_id: _Optional[str] = ..., lease_id: _Optional[int] = ..., load: _Optional[_Union[_common_pb2.WorkerLoad, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., latency: _Optional[_Union[_common_pb2.LatencyModel, _Mapping]] = ..., session_token: _Optional[bytes] = ..., kv_seq: _Optional[int] = ..., report_seq: _Optional[int] = ...) -> None: ...

class ReportLoadResponse(_message.Message):
    __slots__ = ("snapshot_requested",)
    SNAPSHOT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    snapshot_requested: bool
    def __init__(self, snapshot_requested: _Optional[bool] = ...) -> None: ...

class PublishKVEventsRequest(_message.Message):
    __slots__ = ("worker_id", "lease_id", "seq", "events", "snapshot", "session_token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_id: int
    seq: int
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.KVEvent]
    snapshot: bool
    session_token: bytes
    def __init__(self, worker_id: _Optional[str] = ..., lease_id: _Optional[int] = ..., seq: _Optional[int] = ..., events: _Optional[_Iterable[_Union[_common_pb2.KVEvent, _Mapping]]] = ..., snapshot: _Optional[bool] = ..., session_token: _Optional[bytes] = ...) -> None: ...

class PublishKVEventsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("worker_id", "lease_id", "session_token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_id: int
    session_token: bytes
    def __init__(self, worker_id: _Optional[str] = ..., lease_id: _Optional[int] = ..., session_token: _Optional[bytes] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

"""Fuzz: a few hundred random and malformed messages per RPC of every kvplane service.

Each RPC gets random well-formed messages (every field filled with random values: odd strings,
huge and zero numbers, random bytes, nested messages, long repeated fields) and random bytes that
are not a valid message at all. Callers hold identities that pass the role checks, so the
messages reach the handlers. No answer may be INTERNAL or UNKNOWN (a handler that crashed), and
the cluster serves normally afterwards. Seeded, so a failure replays.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf.message import Message

from kvplane.apps.cluster import LocalCluster
from kvplane.grpc_util import channel
from kvplane.security.identity import Identity, Role
from kvplane.security.local import CONTROLPLANE
from kvplane.v1 import agent_pb2, client_pb2, registry_pb2

from .conftest import serving

pytestmark = pytest.mark.cluster

NUM_STRUCTURED = 150  # per RPC
NUM_RAW = 60  # per RPC
CRASHES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
_F = pb_descriptor.FieldDescriptor


@pytest.fixture(scope="module")
def fuzz_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_prefill=1, num_decode=1, controlplane_args=("--rate-limit", "0")) as running:
        yield running


def _scalar(field: pb_descriptor.FieldDescriptor, rng: random.Random):
    kind = field.type
    if kind == _F.TYPE_STRING:
        return rng.choice(["", "decode", "prefill-", "*", "../../x", "\u202e\U0001f600" * rng.randint(1, 50), "a" * rng.randint(0, 5000),
                           "objectives.*.interactive.ttft_ms", "admission.policy", "".join(chr(rng.randint(1, 0xD7FF)) for _ in range(20))])  # fmt: skip
    if kind == _F.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 16, 32, 33, 64, 65, 1000]))
    if kind == _F.TYPE_BOOL:
        return rng.random() < 0.5
    if kind in (_F.TYPE_FLOAT, _F.TYPE_DOUBLE):
        return rng.choice([0.0, -1.0, 1e-9, 0.5, 1.0, 1e30, float("inf"), float("-inf"), float("nan"), rng.uniform(-1e6, 1e6)])
    if kind == _F.TYPE_ENUM:
        return rng.choice([v.number for v in field.enum_type.values] + [rng.randint(0, 1000)])
    if kind in (_F.TYPE_INT32, _F.TYPE_SINT32, _F.TYPE_SFIXED32):
        return rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-1000, 1000)])
    if kind in (_F.TYPE_INT64, _F.TYPE_SINT64, _F.TYPE_SFIXED64):
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randint(-(2**40), 2**40)])
    if kind in (_F.TYPE_UINT32, _F.TYPE_FIXED32):
        return rng.choice([0, 1, 7, 16, 255, 2**32 - 1, rng.randint(0, 70000)])
    return rng.choice([0, 1, 2**64 - 1, rng.randint(0, 2**40)])  # uint64 / fixed64


def random_message(cls: type[Message], rng: random.Random, depth: int = 0) -> Message:
    message = cls()
    for field in cls.DESCRIPTOR.fields:
        if rng.random() < 0.3:
            continue
        repeated = field.is_repeated
        if field.type == _F.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                continue
            if depth >= 3:
                continue
            sub = field.message_type._concrete_class
            if repeated:
                for _ in range(rng.choice([0, 1, 3])):
                    getattr(message, field.name).add().CopyFrom(random_message(sub, rng, depth + 1))
            else:
                getattr(message, field.name).CopyFrom(random_message(sub, rng, depth + 1))
        elif repeated:
            count = rng.choice([0, 1, 5, 100, 10_000])
            getattr(message, field.name).extend(_scalar(field, rng) for _ in range(count))
        else:
            setattr(message, field.name, _scalar(field, rng))
    return message


SERVICES = [
    (client_pb2, "Kvplane", None),  # as the local admin: every client and admin call
    (registry_pb2, "Registry", Identity(Role.WORKER, "fuzz")),
    (agent_pb2, "Agent", CONTROLPLANE),  # the role agents take work from; tickets stay unforgeable
]


def _calls():
    for module, service_name, identity in SERVICES:
        service = module.DESCRIPTOR.services_by_name[service_name]
        for method in service.methods:
            yield pytest.param(module, service, method, identity, id=f"{service_name}.{method.name}")


@pytest.mark.parametrize("module, service, method, identity", list(_calls()))
def test_random_and_malformed_messages_never_crash_a_handler(fuzz_cluster, module, service, method, identity):
    rng = random.Random(f"{service.name}.{method.name}")
    credentials = fuzz_cluster.credentials.admin if identity is None else fuzz_cluster.credentials.for_identity(identity)
    endpoint = fuzz_cluster.worker_endpoints["decode-0"] if service.name == "Agent" else fuzz_cluster.endpoint
    path = f"/{service.full_name}/{method.name}"
    request_class = method.input_type._concrete_class
    with channel(endpoint, credentials) as ch:
        invoke = (ch.unary_stream if method.server_streaming else ch.unary_unary)(path, request_serializer=lambda b: b)
        crashes = []
        for number in range(NUM_STRUCTURED + NUM_RAW):
            if number < NUM_STRUCTURED:
                payload = random_message(request_class, rng).SerializeToString()
            else:
                payload = rng.randbytes(rng.choice([1, 2, 7, 64, 1000]))
            try:
                result = invoke(payload, timeout=20)
                if method.server_streaming:
                    for _ in result:
                        pass
            except grpc.RpcError as e:
                if e.code() in CRASHES:
                    crashes.append(f"#{number}: {e.code().name}: {e.details()[:200]}")
        assert crashes == []
    serving(fuzz_cluster)

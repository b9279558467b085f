"""The attacks of issue 11, each played with a raw gRPC client against a secure local cluster:
every one is refused with the fitting status, and the cluster keeps serving after it."""

from __future__ import annotations

import time

import grpc
import pytest

import kvplane
from kvplane import tickets
from kvplane.security.identity import ANY_WORKER, Identity, Role
from kvplane.security.limits import KV_BATCH_MAX_HASHES
from kvplane.v1 import agent_pb2, client_pb2, common_pb2, registry_pb2

from .conftest import MAX_WORKERS, rpc_error, serving, tenant, worker, worker_info

pytestmark = pytest.mark.cluster

PROMPT = list(range(100, 180))  # five blocks of 16


def register(stub, info, ttl: int = 0):
    return stub.Register(registry_pb2.RegisterRequest(info=info, ttl_seconds=ttl), timeout=10)


def test_a_client_or_a_worker_of_another_id_cannot_register_and_the_reply_never_holds_the_signing_key(cluster, as_identity):
    info = worker_info(cluster, "decode-0")
    for identity, code in [
        (tenant("mallory"), grpc.StatusCode.PERMISSION_DENIED),  # not a worker at all
        (Identity(Role.ADMIN, "ops"), grpc.StatusCode.PERMISSION_DENIED),
        (worker("evil"), grpc.StatusCode.PERMISSION_DENIED),  # a worker, but not decode-0: no takeover
    ]:
        error = rpc_error(register, as_identity(identity).registry(), info)
        assert error.code() == code, (identity, error.details())
    # A trusted worker registering its own id with an absurd lease gets the capped one, a public
    # key and a session token: nothing it could sign tickets with.
    reply = register(as_identity(worker("evil")).registry(), worker_info(cluster, "evil"), ttl=10_000_000)
    try:
        assert reply.ttl_seconds <= 60
        assert len(reply.ticket_public_key) == 32 and len(reply.session_token) == 32
        assert [f.name for f, _ in reply.ListFields()] == ["worker_id", "lease_id", "ttl_seconds", "ticket_public_key", "session_token"]
        # The public key verifies, it does not sign: a ticket "signed" with it is refused.
        forged = tickets.TicketSigner(reply.ticket_public_key).issue(tickets.DRAIN, "decode-0")
        error = rpc_error(as_identity(worker("evil")).agent("decode-0").Drain, agent_pb2.DrainRequest(ticket=forged), timeout=10)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        as_identity(worker("evil")).registry().Deregister(
            registry_pb2.DeregisterRequest(worker_id="evil", lease_id=reply.lease_id, session_token=reply.session_token), timeout=10
        )
    serving(cluster)


def test_deregister_and_keepalive_need_the_session_of_that_registration(cluster, as_identity):
    evil = as_identity(worker("evil2"))
    stub = evil.registry()
    mine = register(stub, worker_info(cluster, "evil2"))
    try:
        # Guessing lease ids (sequential in the store) gets nowhere: for another worker's id the
        # identity is wrong, and for its own id a guessed lease has no valid session token.
        started = time.monotonic()
        for lease in range(1, 400):
            for worker_id, code in (("decode-0", grpc.StatusCode.PERMISSION_DENIED), ("evil2", grpc.StatusCode.PERMISSION_DENIED)):
                error = rpc_error(stub.Deregister, registry_pb2.DeregisterRequest(worker_id=worker_id, lease_id=lease), timeout=10)
                assert error.code() == code
        assert time.monotonic() - started < 60
        # Its own session token does not open another worker's registration.
        error = rpc_error(
            stub.KeepAlive,
            registry_pb2.KeepAliveRequest(worker_id="decode-0", lease_id=mine.lease_id, session_token=mine.session_token),
            timeout=10,
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        with cluster.client(timeout=30) as client:
            assert {w.worker_id for w in client.workers()} >= {"prefill-0", "decode-0"}
    finally:
        stub.Deregister(
            registry_pb2.DeregisterRequest(worker_id="evil2", lease_id=mine.lease_id, session_token=mine.session_token), timeout=10
        )
    serving(cluster)


def test_agents_take_work_and_admin_calls_only_from_the_control_plane_with_a_ticket(cluster, as_identity):
    layout = worker_info(cluster, "x", copy_of="prefill-0").layout
    forged_key = tickets.TicketSigner(tickets.new_signing_key())
    forged = forged_key.issue(tickets.GENERATE, "decode-0", request_id="r", prefill_worker_id="prefill-0", prompt_token_ids=PROMPT)
    forever = forged_key.issue(tickets.GENERATE, "decode-0", request_id="r", prefill_worker_id="prefill-0", prompt_token_ids=PROMPT)
    forever.expires_at = time.time() + 31 * 365 * 86400
    for identity in (tenant("mallory"), Identity(Role.ADMIN, "ops"), worker("prefill-0")):
        agent = as_identity(identity).agent("decode-0")
        calls = [
            (agent.Generate, agent_pb2.AgentGenerateRequest(ticket=forged, request_id="r", prompt_token_ids=PROMPT)),
            (agent.Drain, agent_pb2.DrainRequest()),
            (agent.Undrain, agent_pb2.UndrainRequest()),
            (agent.Profile, agent_pb2.ProfileRequest()),
        ]
        for call, request in calls:
            error = rpc_error(call, request, timeout=10)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (identity, call, error.details())
    # A worker identity reaches the peer calls, but without a genuine ticket they are refused.
    peer = as_identity(worker("decode-0")).agent("prefill-0")
    for ticket in (common_pb2.Ticket(), forged, forever):
        prefill = agent_pb2.PrefillRequest(ticket=ticket, request_id="r", prompt_token_ids=PROMPT, layout=layout, transports=["grpc"])
        for call, request in (
            (peer.Prefill, prefill),
            (peer.PullKV, agent_pb2.PullKVRequest(transfer_id="t", ticket=ticket, layout=layout)),
            (peer.ReleaseKV, agent_pb2.ReleaseKVRequest(transfer_id="t", ticket=ticket)),
        ):
            error = rpc_error(call, request, timeout=10)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (call, error.details())
    serving(cluster)


def test_admin_calls_need_an_admin(cluster, as_identity):
    stub = as_identity(tenant("mallory")).kvplane()
    for method, request in [
        ("SetConfig", client_pb2.SetConfigRequest(key="admission.policy", value="threshold")),
        ("GetConfig", client_pb2.GetConfigRequest()),
        ("DrainWorker", client_pb2.DrainWorkerRequest(worker_id="decode-0")),
        ("UndrainWorker", client_pb2.DrainWorkerRequest(worker_id="decode-0")),
        ("ProfileWorker", client_pb2.ProfileWorkerRequest(worker_id="decode-0")),
        ("GetCache", client_pb2.GetCacheRequest()),
        ("GetStats", client_pb2.GetStatsRequest()),
    ]:
        error = rpc_error(getattr(stub, method), request, timeout=10)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "needs the admin role" in error.details(), method
    assert stub.ListWorkers(client_pb2.ListWorkersRequest(), timeout=10).workers  # what a client may do
    serving(cluster)


def test_drain_then_undrain_returns_the_worker_to_routing(cluster):
    with cluster.client(timeout=60) as client:
        assert client.drain("decode-0").state.value == "draining"
        deadline = time.monotonic() + 10
        while next(w for w in client.workers() if w.worker_id == "decode-0").state.value != "draining":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(kvplane.UnavailableError):  # its only decode worker is drained
            client.generate([1, 2, 3], max_tokens=1, disagg="never")
        assert client.undrain("decode-0").state.value == "active"
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.generate([1, 2, 3], max_tokens=1).metrics.decode_worker == "decode-0"
                break
            except kvplane.KvplaneError:
                assert time.monotonic() < deadline
                time.sleep(0.2)


def test_tenants_never_see_each_others_cached_tokens(cluster):
    alice = cluster.credentials.client("alice")
    bob = cluster.credentials.client("bob")
    from kvplane import Client

    prompt = [(7 * i) % 250 + 3 for i in range(100)]
    with Client(cluster.endpoint, credentials=alice, timeout=60) as a, Client(cluster.endpoint, credentials=bob, timeout=60) as b:
        a.generate(prompt, max_tokens=2)
        a.generate(prompt, max_tokens=2)  # now cached for alice
        assert a.route(prompt).cached_tokens >= 96
        # Bob asks about the same prompt: no cached tokens anywhere, whatever salt he picks,
        # including alice's derived salt spelled out.
        for salt in ("", "alice", "t/app:alice/", "t/alice/"):
            route = b.route(prompt, cache_salt=salt)
            assert route.cached_tokens == 0 and all(c.cached_tokens == 0 for c in route.candidates), salt
            assert b.generate(prompt, max_tokens=2, cache_salt=salt).metrics.cached_tokens == 0
        # Alice narrowing her own cache with a salt starts a fresh namespace too.
        assert a.route(prompt, cache_salt="project-x").cached_tokens == 0


def test_registration_and_kv_event_limits(cluster, as_identity):
    made = []
    try:
        # Bounded workers per cluster: trusted identities, but no more than the cap.
        for index in range(MAX_WORKERS + 2):
            stub = as_identity(worker(f"many-{index}")).registry()
            try:
                made.append((stub, f"many-{index}", register(stub, worker_info(cluster, f"many-{index}"))))
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and f"maximum of {MAX_WORKERS}" in e.details()
                break
        else:
            raise AssertionError("the worker cap was never reached")
        stub, worker_id, reply = made[0]

        def publish(seq, hashes, snapshot=False, size=32):
            event = common_pb2.KVEvent(stored=common_pb2.BlockStored(block_hashes=[i.to_bytes(size, "big") for i in hashes]))
            return stub.PublishKVEvents(
                registry_pb2.PublishKVEventsRequest(worker_id=worker_id, lease_id=reply.lease_id, seq=seq, events=[event],
                                                    snapshot=snapshot, session_token=reply.session_token), timeout=30)  # fmt: skip

        error = rpc_error(publish, 1, range(KV_BATCH_MAX_HASHES + 1), True)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "split it" in error.details()
        error = rpc_error(publish, 1, range(3), True, 100)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A snapshot larger than one batch goes as a snapshot plus stored batches: all of it lands.
        publish(1, range(KV_BATCH_MAX_HASHES), True)
        publish(2, range(KV_BATCH_MAX_HASHES, 2 * KV_BATCH_MAX_HASHES))
        publish(3, range(2 * KV_BATCH_MAX_HASHES, 2 * KV_BATCH_MAX_HASHES + 100))
        with cluster.client(timeout=30) as client:
            deadline = time.monotonic() + 10
            while True:
                held = {c.worker_id: sum(c.blocks_by_tier.values()) for c in client.cache()}
                if held.get(worker_id) == 2 * KV_BATCH_MAX_HASHES + 100:
                    break
                assert time.monotonic() < deadline, held
                time.sleep(0.1)
    finally:
        for stub, worker_id, reply in made:
            stub.Deregister(
                registry_pb2.DeregisterRequest(worker_id=worker_id, lease_id=reply.lease_id, session_token=reply.session_token), timeout=10
            )
    serving(cluster)


def test_oversized_prompts_and_fields_are_refused_without_echo(cluster, as_identity):
    stub = as_identity(tenant("mallory")).kvplane()
    huge = "x" * (2 * 1024 * 1024)
    started = time.monotonic()
    error = rpc_error(stub.Route, client_pb2.GenerateRequest(text=huge, sampling=common_pb2.SamplingParams(max_tokens=1)), timeout=30)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit" in error.details()
    assert time.monotonic() - started < 5  # refused before any tokenization
    for request in (
        client_pb2.GenerateRequest(
            model="m" * 100_000, token_ids=client_pb2.TokenIds(ids=[1]), sampling=common_pb2.SamplingParams(max_tokens=1)
        ),
        client_pb2.GenerateRequest(
            priority="p" * 100_000, token_ids=client_pb2.TokenIds(ids=[1]), sampling=common_pb2.SamplingParams(max_tokens=1)
        ),
        client_pb2.GenerateRequest(
            request_id="r" * 100_000, token_ids=client_pb2.TokenIds(ids=[1]), sampling=common_pb2.SamplingParams(max_tokens=1)
        ),
    ):
        error = rpc_error(stub.Route, request, timeout=10)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and len(error.details()) < 500
    error = rpc_error(as_identity().kvplane().DrainWorker, client_pb2.DrainWorkerRequest(worker_id="w" * 100_000), timeout=10)
    assert error.code() == grpc.StatusCode.NOT_FOUND and len(error.details()) < 500
    # A message above the server's 8 MiB request limit never reaches a handler.
    error = rpc_error(stub.Route, client_pb2.GenerateRequest(token_ids=client_pb2.TokenIds(ids=[2_000_000_000] * 2_000_000)), timeout=30)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    serving(cluster)


def test_the_request_rate_is_limited_per_identity(cluster, as_identity):
    noisy = as_identity(tenant("noisy")).kvplane()
    codes = []
    for _ in range(120):
        try:
            noisy.ListWorkers(client_pb2.ListWorkersRequest(), timeout=10)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
            assert "rate limit" in e.details()
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes and codes[0] == grpc.StatusCode.OK
    assert (
        as_identity(tenant("quiet")).kvplane().ListWorkers(client_pb2.ListWorkersRequest(), timeout=10).workers
    )  # others are not affected
    serving(cluster)


def test_join_token_workers_cannot_take_over_a_live_id(tmp_path):
    """A plaintext cluster: workers join with the join token; it lets them register a free id, never a live one."""
    from kvplane.apps.cluster import LocalCluster
    from kvplane.grpc_util import channel
    from kvplane.security.credentials import Credentials
    from kvplane.v1 import registry_pb2_grpc

    with LocalCluster(num_prefill=0, num_decode=1, insecure=True, log_dir=tmp_path) as insecure:
        info = worker_info(insecure, "decode-0")
        anonymous = registry_pb2_grpc.RegistryStub(channel(insecure.endpoint, Credentials.plaintext()))
        assert rpc_error(register, anonymous, info).code() == grpc.StatusCode.PERMISSION_DENIED  # the anonymous client
        wrong = registry_pb2_grpc.RegistryStub(channel(insecure.endpoint, Credentials.plaintext("not-the-join-token-at-all")))
        assert rpc_error(register, wrong, info).code() == grpc.StatusCode.UNAUTHENTICATED
        joined = registry_pb2_grpc.RegistryStub(channel(insecure.endpoint, Credentials.plaintext(insecure.credentials.join_token)))
        error = rpc_error(register, joined, info)
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS and "lease is alive" in error.details()
        # Anonymous plaintext callers are clients: admin calls and agent work need more.
        client = insecure.client()
        with pytest.raises(kvplane.PermissionDeniedError, match="needs the admin role"):
            with kvplane.Client(insecure.endpoint, credentials=Credentials.plaintext(), timeout=10) as anon:
                anon.set_config("admission.policy", "threshold")
        assert client.generate([1, 2, 3], max_tokens=2).token_ids
        agent = insecure.worker_endpoints["decode-0"]
        from kvplane.v1 import agent_pb2_grpc

        stub = agent_pb2_grpc.AgentStub(channel(agent, Credentials.plaintext()))
        assert rpc_error(stub.Drain, agent_pb2.DrainRequest(), timeout=10).code() == grpc.StatusCode.PERMISSION_DENIED
        assert ANY_WORKER == "*"
        client.close()


def _place(kvplane_stub, prompt, max_tokens: int = 4) -> client_pb2.Placement:
    request = client_pb2.GenerateRequest(
        token_ids=client_pb2.TokenIds(ids=prompt), sampling=common_pb2.SamplingParams(max_tokens=max_tokens), lookaside=True
    )
    return kvplane_stub.Route(request, timeout=30).placement


def test_a_lookaside_placement_runs_once_for_its_own_tenant_and_only_as_placed(cluster, as_identity):
    alice, mallory = as_identity(tenant("alice")), as_identity(tenant("mallory"))
    placement = _place(alice.kvplane(), PROMPT)
    request = agent_pb2.AgentGenerateRequest.FromString(placement.agent_request)
    assert request.ticket.tenant == "alice" and request.ticket.decode_worker_id == placement.worker_id
    # Another tenant holding the placement can neither run it nor report on it.
    error = rpc_error(mallory.agent(placement.worker_id).Generate, request, timeout=30)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "another tenant" in error.details(), error.details()
    report = client_pb2.ReportRequest(placement_id=placement.placement_id, event=client_pb2.ReportRequest.CANCELLED)
    assert rpc_error(mallory.kvplane().Report, report, timeout=10).code() == grpc.StatusCode.NOT_FOUND
    [answer] = mallory.kvplane().ReportStream(iter([report]), timeout=10)  # nor on the report stream
    assert answer.code == grpc.StatusCode.NOT_FOUND.value[0]
    # Tampered with (another prompt, or another salt: another tenant's cache), it is refused.
    for field, value in (("prompt_token_ids", [*PROMPT[:-1], 7]), ("cache_salt", "tenant/bob")):
        tampered = agent_pb2.AgentGenerateRequest()
        tampered.CopyFrom(request)
        if field == "prompt_token_ids":
            tampered.prompt_token_ids[:] = value
        else:
            tampered.cache_salt = value
        error = rpc_error(alice.agent(placement.worker_id).Generate, tampered, timeout=30)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (field, error.details())
    # Its owner runs it once; the ticket is single use.
    replies = list(alice.agent(placement.worker_id).Generate(request, timeout=60))
    assert replies[-1].finished and sum(len(r.token_ids) for r in replies) == 4
    error = rpc_error(alice.agent(placement.worker_id).Generate, request, timeout=30)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "single use" in error.details(), error.details()
    finished = client_pb2.ReportRequest(placement_id=placement.placement_id, event=client_pb2.ReportRequest.FINISHED, num_tokens=4)
    finished.metrics.CopyFrom(replies[-1].metrics)
    alice.kvplane().Report(finished, timeout=10)
    # Reported, the placement is gone: a second report finds nothing.
    assert rpc_error(alice.kvplane().Report, finished, timeout=10).code() == grpc.StatusCode.NOT_FOUND
    serving(cluster)

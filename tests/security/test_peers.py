"""The attacks of issue 28 on who a peer is and what a placement may run (items 1 and 6):

- a tenant's certificate (or another worker's) serving as the prefill peer: the decode agent's
  channel refuses it in the handshake, and the request prefills locally;
- a lookaside placement whose prefill_from is pointed at a server of the tenant's own: refused,
  nothing dials that server;
- a lookaside placement asking for more tokens than it was admitted for: refused;
- a tenant's cache salt: nobody computes it from the tenant's name.

The first test runs a real agent service in this process with mutual TLS (a throw-away CA), the
others a secure local cluster; every call is real gRPC over loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

import grpc
import pytest

from kvplane import tickets
from kvplane.dataplane import engines
from kvplane.dataplane.agent import access
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.service import AgentService
from kvplane.dataplane.engines.reference import EngineConfig
from kvplane.dataplane.transport import make_transport
from kvplane.grpc_util import add_port, aio_channel, make_server
from kvplane.security.auth import Authenticator, AuthInterceptor
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role
from kvplane.security.local import CONTROLPLANE, LocalCredentials
from kvplane.types import Role as WorkerRole
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, common_pb2

from .conftest import cancel, place, rpc_error, serving, tenant, worker

PROMPT = list(range(100, 180))  # five blocks of 16, above the cluster's disaggregation threshold of 32


class FakePeer(agent_pb2_grpc.AgentServicer):
    """An Agent server of the attacker's: it counts the Prefill calls that reach it (and refuses
    them UNAVAILABLE, so that a decode agent that did dial it still finishes the request locally)."""

    def __init__(self) -> None:
        self.num_prefills = 0

    async def Prefill(self, request, context):
        self.num_prefills += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the attacker's server")


@contextlib.asynccontextmanager
async def fake_peer(pair: Credentials):
    """FakePeer on a loopback port, presenting `pair`'s certificate; yields (servicer, endpoint)."""
    servicer = FakePeer()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)], root_certificates=pair.ca_pem, require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def tls_agent(local: LocalCredentials, signer: tickets.TicketSigner, worker_id: str = "decode-x", role=WorkerRole.DECODE):
    """An agent as `kvplane agent` runs it with mTLS (its certificate, the agent access policy, the
    grpc KV transport), in this process; yields a stub on a control-plane channel to it, and its endpoint."""
    engine = engines.create("reference", EngineConfig(num_blocks=64))
    await engine.start()
    mine = local.for_identity(Identity(Role.WORKER, worker_id))
    server = make_server([AuthInterceptor(Authenticator(tls=True), access.policy())])
    endpoint = f"127.0.0.1:{add_port(server, '127.0.0.1:0', mine)}"
    transports = {"grpc": make_transport("grpc", engine.kv_transfer.pool, agent_name=worker_id, credentials=mine)}
    verifier = tickets.TicketVerifier(signer.public_key)
    config = AgentConfig(worker_id=worker_id, role=role).validate()
    service = AgentService(config, engine, transports, lambda: verifier, endpoint, credentials=mine)
    agent_pb2_grpc.add_AgentServicer_to_server(service, server)
    await server.start()
    service.start()
    channel = aio_channel(endpoint, local.for_identity(CONTROLPLANE))
    try:
        yield agent_pb2_grpc.AgentStub(channel), endpoint
    finally:
        await channel.close()
        await server.stop(0)
        await service.close()
        await engine.stop()


def test_only_the_worker_the_ticket_names_can_serve_as_prefill_peer(tmp_path):
    """The ticket is genuine and names prefill-0, but its endpoint leads to someone else (a stale
    address, a hijacked one): a tenant's client certificate, or a certificate of another worker,
    never serves the prefill. The genuine prefill-0 certificate does (the positive control)."""
    local = LocalCredentials.create(tmp_path)
    signer = tickets.TicketSigner(tickets.new_signing_key())
    presented = {
        "tenant mallory's client certificate": (local.client("mallory"), 0),
        "worker evil's certificate": (local.for_identity(worker("evil")), 0),
        "prefill-0's own certificate": (local.for_identity(worker("prefill-0")), 1),
    }

    async def main() -> dict[str, tuple[int, common_pb2.RequestMetrics]]:
        seen = {}
        async with tls_agent(local, signer) as (stub, _):
            for number, (what, (pair, _)) in enumerate(presented.items()):
                async with fake_peer(pair) as (peer, endpoint):
                    request = agent_pb2.AgentGenerateRequest(
                        request_id=f"r{number}", prompt_token_ids=PROMPT, cache_salt="t/x/",
                        sampling=common_pb2.SamplingParams(max_tokens=2, ignore_eos=True),
                        prefill_from=agent_pb2.PrefillSource(worker_id="prefill-0", endpoint=endpoint),
                    )  # fmt: skip
                    request.ticket.CopyFrom(signer.issue_generate(request, "decode-x"))
                    replies = [reply async for reply in stub.Generate(request, timeout=60)]
                    seen[what] = (peer.num_prefills, replies[-1].metrics)
        return seen

    for what, (num_prefills, metrics) in asyncio.run(main()).items():
        assert num_prefills == presented[what][1], what
        # Whoever answered, the request was served here, by local prefill.
        assert not metrics.disaggregated and metrics.prefill_worker == "decode-x", what


def test_the_named_peer_prefills_and_serves_its_kv_over_verified_channels(tmp_path):
    """The positive side: with the real prefill-0 at the endpoint, the decode agent's Prefill and
    the grpc transport's PullKV (each on a channel that verifies prefill-0's certificate) work."""
    local = LocalCredentials.create(tmp_path)
    signer = tickets.TicketSigner(tickets.new_signing_key())

    async def main() -> common_pb2.RequestMetrics:
        async with tls_agent(local, signer) as (stub, _), tls_agent(local, signer, "prefill-0", WorkerRole.PREFILL) as (_, peer):
            request = agent_pb2.AgentGenerateRequest(
                request_id="r", prompt_token_ids=PROMPT, cache_salt="t/x/", sampling=common_pb2.SamplingParams(max_tokens=2),
                prefill_from=agent_pb2.PrefillSource(worker_id="prefill-0", endpoint=peer),
            )  # fmt: skip
            request.ticket.CopyFrom(signer.issue_generate(request, "decode-x"))
            return [reply async for reply in stub.Generate(request, timeout=60)][-1].metrics

    metrics = asyncio.run(main())
    assert metrics.disaggregated and metrics.prefill_worker == "prefill-0" and metrics.transport == "grpc"
    assert metrics.kv_transfer_blocks == 5 and metrics.kv_transfer_bytes > 0


@pytest.mark.cluster
def test_a_lookaside_placement_cannot_point_its_prefill_at_another_server(cluster, as_identity):
    mallory = as_identity(tenant("mallory"))
    placement = place(mallory.kvplane(), PROMPT, 2, disagg=common_pb2.DISAGG_MODE_ALWAYS)
    request = agent_pb2.AgentGenerateRequest.FromString(placement.agent_request)
    assert request.prefill_from.worker_id == "prefill-0"
    genuine = request.prefill_from.endpoint

    async def attack() -> tuple[int, grpc.RpcError | None]:
        # Mallory's own server, with her own certificate: issue 28 saw the decode agent pull its
        # blocks and commit them under hashes of her choosing.
        async with fake_peer(cluster.credentials.client("mallory")) as (peer, endpoint):
            request.prefill_from.endpoint = endpoint
            error = await asyncio.to_thread(rpc_error, mallory.agent(placement.worker_id).Generate, request, timeout=60)
            return peer.num_prefills, error

    num_prefills, error = asyncio.run(attack())
    assert num_prefills == 0
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "not the peer the ticket names" in error.details(), error.details()
    assert request.ticket.prefill_endpoint == genuine  # the endpoint the control plane named, signed
    # A genuine worker's certificate with someone else's ticket fares no better on the peer itself.
    prefill = agent_pb2.PrefillRequest(
        ticket=request.ticket, request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
        cache_salt=request.cache_salt, transports=["grpc"],
    )  # fmt: skip
    for identity, words in ((worker("evil"), "not the worker this transfer's ticket was issued to"), (tenant("mallory"), "worker role")):
        error = rpc_error(as_identity(identity).agent("prefill-0").Prefill, prefill, timeout=30)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and words in error.details(), (identity, error.details())
    cancel(mallory.kvplane(), placement)
    serving(cluster)


@pytest.mark.cluster
def test_a_lookaside_placement_runs_no_more_tokens_than_admitted(cluster, as_identity):
    mallory = as_identity(tenant("mallory"))
    placement = place(mallory.kvplane(), PROMPT[:8], 1, disagg=common_pb2.DISAGG_MODE_NEVER)
    request = agent_pb2.AgentGenerateRequest.FromString(placement.agent_request)
    agent = mallory.agent(placement.worker_id)
    for field, value, words in (
        ("max_tokens", 1000, "asks for 1000 tokens; it was admitted for at most 1"),
        ("ignore_eos", True, "sampling parameters"),
        ("temperature", 1.0, "sampling parameters"),
    ):
        tampered = agent_pb2.AgentGenerateRequest()
        tampered.CopyFrom(request)
        setattr(tampered.sampling, field, value)
        error = rpc_error(agent.Generate, tampered, timeout=60)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and words in error.details(), (field, error.details())
    # The refusals did not burn the ticket: the placement as issued runs, for its one token.
    replies = list(agent.Generate(request, timeout=60))
    assert replies[-1].finished and sum(len(r.token_ids) for r in replies) == 1
    finished = client_pb2.ReportRequest(placement_id=placement.placement_id, event=client_pb2.ReportRequest.FINISHED, num_tokens=1)
    finished.metrics.CopyFrom(replies[-1].metrics)
    mallory.kvplane().Report(finished, timeout=10)
    serving(cluster)


@pytest.mark.cluster
def test_a_tenants_cache_salt_is_not_computable_from_its_name(cluster, as_identity):
    salts = {}
    for name in ("alice", "bob"):
        stub = as_identity(tenant(name)).kvplane()
        placement = place(stub, PROMPT[:8], 1, disagg=common_pb2.DISAGG_MODE_NEVER)
        salts[name] = agent_pb2.AgentGenerateRequest.FromString(placement.agent_request).cache_salt
        cancel(stub, placement)
    for name, salt in salts.items():
        # Issue 28 computed block hashes for another tenant's prompt from "t/<tenant>/".
        assert salt != f"t/{name}/" and name not in salt and re.fullmatch(r"t/[0-9a-f]{32}/", salt), salt
    assert salts["alice"] != salts["bob"]
    serving(cluster)


@pytest.mark.cluster
def test_honest_peers_still_prefill_for_each_other_under_mutual_tls(cluster):
    """The positive side of the checks above: the channels to the real prefill-0 verify, so a
    disaggregated request is prefilled there and its KV pulled, not silently prefilled locally."""
    with cluster.client(timeout=60) as client:
        result = client.generate([(11 * i) % 250 + 3 for i in range(80)], max_tokens=2, disagg="always")
    metrics = result.metrics
    assert metrics.disaggregated and metrics.prefill_worker == "prefill-0" and metrics.decode_worker == "decode-0"
    assert metrics.kv_transfer_blocks == 5 and metrics.kv_transfer_bytes > 0, metrics


class StatusOnly(agent_pb2_grpc.AgentServicer):
    async def GetStatus(self, request, context):
        return agent_pb2.GetStatusResponse()


def test_the_control_plane_sends_a_worker_s_calls_only_to_that_worker(tmp_path):
    """The control plane's channel to an agent verifies the certificate names the worker the plan
    chose: a server at that worker's address with another worker's (or a tenant's) certificate
    gets no call, so neither the request nor its ticket reaches it."""
    from kvplane.controlplane.client_service import AgentStubs  # noqa: PLC0415

    local = LocalCredentials.create(tmp_path)

    async def body():
        stubs = AgentStubs(local.for_identity(CONTROLPLANE))
        try:
            for presented, its_worker_id in ((local.for_identity(worker("decode-9")), "decode-9"), (local.client("alice"), None)):
                server = grpc.aio.server()
                agent_pb2_grpc.add_AgentServicer_to_server(StatusOnly(), server)
                port = server.add_secure_port(
                    "127.0.0.1:0",
                    grpc.ssl_server_credentials(
                        [(presented.key_pem, presented.cert_pem)], root_certificates=presented.ca_pem, require_client_auth=True
                    ),
                )
                await server.start()
                try:
                    endpoint = f"127.0.0.1:{port}"
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stubs.get("decode-0", endpoint).GetStatus(agent_pb2.GetStatusRequest(), timeout=5)
                    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
                    if its_worker_id is not None:  # called as the worker it is: verified and served
                        await stubs.get(its_worker_id, endpoint).GetStatus(agent_pb2.GetStatusRequest(), timeout=5)
                finally:
                    await server.stop(0)
        finally:
            await stubs.close()

    asyncio.run(body())

"""The security building blocks on their own, no process: identities and their certificates, the
cache salt, tickets (binding, lifetime, replay), tokens, rate limits, credential lookup, batch
splitting and error clipping."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from kvplane import tickets
from kvplane.controlplane import secrets
from kvplane.controlplane.store import MemoryStore
from kvplane.dataplane.agent.link import split_batches
from kvplane.security import certs
from kvplane.security.auth import TokenTable
from kvplane.security.credentials import Credentials, CredentialsError, cluster_dir, resolve_client
from kvplane.security.identity import Identity, IdentityError, Role, identity_from_spiffe_id, tenant_cache_salt
from kvplane.security.limits import clip
from kvplane.security.local import LocalCredentials
from kvplane.security.ratelimit import RateLimiter
from kvplane.v1 import agent_pb2, common_pb2


def test_identities_round_trip_through_certificates_and_bad_ones_are_named():
    ca = certs.create_ca()
    for identity in (Identity(Role.WORKER, "decode-0"), Identity(Role.CLIENT, "web", "acme"), Identity(Role.ADMIN, "alice"),
                     Identity(Role.CONTROLPLANE, "cp-1")):  # fmt: skip
        assert certs.identity_of(certs.issue(ca, identity).cert_pem) == identity
    assert certs.identity_of(certs.issue(ca, Identity(Role.CLIENT, "web", "acme")).cert_pem).cache_tenant == "acme"
    with pytest.raises(IdentityError, match="no subject alternative names|exactly one spiffe"):
        certs.identity_of(certs.issue_server(ca, "etcd").cert_pem)
    for bad in ("spiffe://other/worker/w", "spiffe://kvplane/root/w", "spiffe://kvplane/client/acme", "spiffe://kvplane/worker/a/b",
                "spiffe://kvplane/worker/" + "x" * 65, "spiffe://kvplane/worker/a:b"):  # fmt: skip
        with pytest.raises(IdentityError):
            identity_from_spiffe_id(bad)
    with pytest.raises(IdentityError, match="only client identities name a tenant"):
        Identity(Role.ADMIN, "alice", "acme")


def test_the_cache_salt_is_a_secret_tag_of_the_tenant_and_no_client_salt_reaches_another_tenant():
    key = os.urandom(32)
    alice, bob = Identity(Role.CLIENT, "app", "alice"), Identity(Role.CLIENT, "app", "bob")
    salt = tenant_cache_salt(alice, key=key)
    assert re.fullmatch(r"t/[0-9a-f]{32}/", salt) and "alice" not in salt
    assert tenant_cache_salt(Identity(Role.CLIENT, "other-app", "alice"), key=key) == salt  # the tenant's, not the app's
    assert tenant_cache_salt(alice, "x", key=key) == salt + "x"
    # Another key (another cluster) gives another salt: the name alone determines nothing.
    assert tenant_cache_salt(alice, key=os.urandom(32)) != salt
    # Whatever bob sends, his salt starts with his own tag: it never equals one of alice's.
    for client_salt in ("", "alice", salt, "t/alice/", "/../alice/", "\x00"):
        assert not tenant_cache_salt(bob, client_salt, key=key).startswith(salt)
    assert tenant_cache_salt(Identity(Role.ADMIN, "alice"), key=key) != salt  # tenant "admin:alice", never a client's
    with pytest.raises(ValueError, match="16 random bytes"):
        tenant_cache_salt(alice, key=b"short")


def test_every_replica_derives_the_same_salt_from_the_key_in_the_store():
    async def main():
        store = MemoryStore()
        first, second = await asyncio.gather(secrets.load_or_create(store), secrets.load_or_create(store))
        again = await secrets.load_or_create(store)  # a replica started later
        return first, second, again

    first, second, again = asyncio.run(main())
    assert first.cache_salt_key == second.cache_salt_key == again.cache_salt_key and len(first.cache_salt_key) == 32
    assert len({first.cache_salt_key, first.session_key, first.signing_key}) == 3
    alice = Identity(Role.CLIENT, "app", "alice")
    assert tenant_cache_salt(alice, key=first.cache_salt_key) == tenant_cache_salt(alice, key=again.cache_salt_key)


def test_certificate_usages_follow_the_role():
    ca = certs.create_ca()
    worker = Identity(Role.WORKER, "decode-0")
    served = x509.load_pem_x509_certificate(certs.issue(ca, worker).cert_pem)
    san = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "decode-0.worker.kvplane" in san.get_values_for_type(x509.DNSName)
    assert set(served.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == {
        ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH,
    }  # fmt: skip
    certs.check_serves(certs.issue(ca, worker).cert_pem, worker)
    with pytest.raises(IdentityError, match="no DNS SAN 'decode-1.worker.kvplane'"):
        certs.check_serves(certs.issue(ca, worker).cert_pem, Identity(Role.WORKER, "decode-1"))
    for caller in (Identity(Role.CLIENT, "web", "acme"), Identity(Role.ADMIN, "ops")):
        made = x509.load_pem_x509_certificate(certs.issue(ca, caller).cert_pem)
        assert list(made.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        names = made.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == [] and names.get_values_for_type(x509.IPAddress) == []
        with pytest.raises(IdentityError, match="does not serve"):
            caller.server_name()
        with pytest.raises(IdentityError, match="only calls servers"):
            certs.issue(ca, caller, ["localhost"])
    assert Credentials.plaintext().for_peer(worker).channel_options() == ()
    assert Credentials(ca_pem=b"x").for_peer(worker).channel_options() == (("grpc.ssl_target_name_override", "decode-0.worker.kvplane"),)


def test_tickets_bind_the_request_and_are_single_use():
    signer = tickets.TicketSigner(tickets.new_signing_key(), ttl_s=30)
    verifier = tickets.TicketVerifier(signer.public_key)
    ticket = signer.issue(
        tickets.GENERATE, "d", request_id="r", prefill_worker_id="p", prompt_token_ids=[1, 2, 3], cache_salt="t/a/", now=1000.0
    )
    verifier.verify(ticket, tickets.GENERATE, now=1010.0)
    tickets.check_request(ticket, worker_id="d", request_id="r", prompt_token_ids=[1, 2, 3], cache_salt="t/a/")
    tickets.check_request(ticket, worker_id="p", as_source=True)
    for kwargs, words in [
        (dict(worker_id="x"), "not this worker"),
        (dict(worker_id="d", request_id="r2"), "another request id"),
        (dict(worker_id="d", prompt_token_ids=[1, 2]), "another prompt"),
        (dict(worker_id="d", cache_salt="t/b/"), "another cache salt"),
        (dict(worker_id="d", as_source=True), "prefill/KV source"),
    ]:
        with pytest.raises(tickets.TicketError, match=words):
            tickets.check_request(ticket, **kwargs)
    with pytest.raises(tickets.TicketError, match="expired"):
        verifier.verify(ticket, tickets.GENERATE, now=1031.0)
    verifier.verify(ticket, tickets.GENERATE, now=1031.0, check_expiry=False)  # pulls: the pin's expiry governs
    with pytest.raises(tickets.TicketError, match="lifetime"):
        verifier.verify(ticket, tickets.GENERATE, now=990.0)  # issued in the future
    with pytest.raises(tickets.TicketError, match="for operation"):
        verifier.verify(ticket, tickets.DRAIN, now=1010.0)
    tampered = common_pb2.Ticket()
    tampered.CopyFrom(ticket)
    tampered.cache_salt = "t/b/"
    with pytest.raises(tickets.TicketError, match="does not verify"):
        verifier.verify(tampered, tickets.GENERATE, now=1010.0)
    with pytest.raises(ValueError, match="TTL"):
        tickets.TicketSigner(tickets.new_signing_key(), ttl_s=61)
    guard = tickets.ReplayGuard()
    guard.use(ticket, "generate", now=1010.0)
    guard.use(ticket, "prefill", now=1010.0)  # another use of the same ticket: the peer's
    with pytest.raises(tickets.TicketError, match="single use"):
        guard.use(ticket, "generate", now=1011.0)
    guard.use(signer.issue(tickets.DRAIN, "d", now=2000.0), "drain", now=2000.0)  # past entries expire meanwhile


def test_generate_tickets_bind_the_prefill_peer_and_the_sampling():
    signer = tickets.TicketSigner(tickets.new_signing_key(), ttl_s=30)
    sampling = common_pb2.SamplingParams(max_tokens=8, temperature=0.5, seed=3, stop_token_ids=[2])
    request = agent_pb2.AgentGenerateRequest(
        request_id="r", prompt_token_ids=[1, 2, 3], sampling=sampling,
        prefill_from=agent_pb2.PrefillSource(worker_id="p", endpoint="10.0.0.2:50061"),
    )  # fmt: skip
    ticket = signer.issue_generate(request, "d", tenant="a")
    tickets.TicketVerifier(signer.public_key).verify(ticket, tickets.GENERATE)
    tickets.check_request(ticket, worker_id="d", generate=request)
    assert (ticket.prefill_endpoint, ticket.max_tokens) == ("10.0.0.2:50061", 8)
    fewer = agent_pb2.AgentGenerateRequest()
    fewer.CopyFrom(request)
    fewer.sampling.max_tokens = 2  # asking for less than admitted is fine
    tickets.check_request(ticket, worker_id="d", generate=fewer)
    for change, words in [
        (lambda r: setattr(r.prefill_from, "endpoint", "10.6.6.6:50061"), "not the peer the ticket names"),
        (lambda r: setattr(r.prefill_from, "cached_only", True), "not the peer the ticket names"),
        (lambda r: setattr(r.prefill_from, "transport", "nixl"), "not the peer the ticket names"),
        (lambda r: r.ClearField("prefill_from"), "as prefill peer, the request none"),
        (lambda r: setattr(r.sampling, "max_tokens", 1000), "asks for 1000 tokens; it was admitted for at most 8"),
        (lambda r: setattr(r.sampling, "temperature", 1.5), "sampling parameters"),
        (lambda r: r.sampling.ClearField("seed"), "sampling parameters"),
        (lambda r: r.sampling.stop_token_ids.append(9), "sampling parameters"),
        (lambda r: setattr(r.sampling, "ignore_eos", True), "sampling parameters"),
    ]:
        tampered = agent_pb2.AgentGenerateRequest()
        tampered.CopyFrom(request)
        change(tampered)
        with pytest.raises(tickets.TicketError, match=words):
            tickets.check_request(ticket, worker_id="d", generate=tampered)
    # A request without a peer: its ticket names none, and a peer added to the request is refused.
    local = agent_pb2.AgentGenerateRequest(request_id="r", prompt_token_ids=[1, 2, 3], sampling=sampling)
    local_ticket = signer.issue_generate(local, "d")
    tickets.check_request(local_ticket, worker_id="d", generate=local)
    local.prefill_from.CopyFrom(agent_pb2.PrefillSource(worker_id="", endpoint="127.0.0.1:6666"))
    with pytest.raises(tickets.TicketError, match="not the peer"):
        tickets.check_request(local_ticket, worker_id="d", generate=local)
    # The prefill side: a ticket for a fetch of cached blocks does not open a prefill, and back.
    fetch = signer.issue(tickets.GENERATE, "d", prefill_worker_id="p", prefill_cached_only=True)
    tickets.check_request(fetch, worker_id="p", as_source=True, cached_only=True)
    with pytest.raises(tickets.TicketError, match="for a fetch of cached blocks"):
        tickets.check_request(fetch, worker_id="p", as_source=True, cached_only=False)
    # Every new field is signed.
    for field, value in (("prefill_endpoint", "x:1"), ("max_tokens", 9), ("sampling_digest", b"x"), ("prefill_cached_only", True)):
        tampered_ticket = common_pb2.Ticket()
        tampered_ticket.CopyFrom(ticket)
        setattr(tampered_ticket, field, value)
        with pytest.raises(tickets.TicketError, match="does not verify"):
            tickets.TicketVerifier(signer.public_key).verify(tampered_ticket, tickets.GENERATE)


def test_token_tables_keep_digests_and_parse_the_static_file(tmp_path):
    path = tmp_path / "tokens.csv"
    path.write_text("# comment\nabcdefghijklmnopqrstuvwx,client,web,acme\nzyxwvutsrqponmlkjihgfedc,admin,alice  # ops\n")
    table = TokenTable.from_file(path)
    assert table.lookup("abcdefghijklmnopqrstuvwx") == Identity(Role.CLIENT, "web", "acme")
    assert table.lookup("zyxwvutsrqponmlkjihgfedc") == Identity(Role.ADMIN, "alice")
    assert table.lookup("nope") is None and len(table) == 2
    path.write_text("short,client,web,acme\n")
    with pytest.raises(ValueError, match="line 1: a token for .* shorter than 16"):
        TokenTable.from_file(path)
    path.write_text("abcdefghijklmnopqrstuvwx,root,web\n")
    with pytest.raises(ValueError, match="line 1"):
        TokenTable.from_file(path)


def test_rate_limiter_allows_the_burst_then_the_rate():
    now = [0.0]
    limiter = RateLimiter(10, 5, clock=lambda: now[0], max_keys=2)
    assert [limiter.acquire("a") for _ in range(5)] == [0.0] * 5
    assert limiter.acquire("a") == pytest.approx(0.1)
    assert limiter.acquire("b") == 0.0  # per identity
    now[0] += 0.1
    assert limiter.acquire("a") == 0.0
    limiter.acquire("c")  # a third key drops the idlest
    assert len(limiter._buckets) == 2
    assert RateLimiter(0, 1).acquire("x") == 0.0  # 0 = no limit


def test_clients_find_credentials_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPLANE_HOME", str(tmp_path / "home"))
    for name in ("KVPLANE_TLS_CA", "KVPLANE_TLS_CERT", "KVPLANE_TLS_KEY", "KVPLANE_TOKEN", "KVPLANE_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    assert resolve_client("127.0.0.1:5").source.startswith("defaults: no credentials found")
    local = LocalCredentials.create(tmp_path / "creds")
    local.publish("127.0.0.1:5")
    found = resolve_client("localhost:5")  # the loopback alias finds it too
    assert found.mutual and "local cluster credentials" in found.source
    monkeypatch.setenv("KVPLANE_TOKEN", "t" * 20)
    assert resolve_client("127.0.0.1:5").token == "t" * 20 and not resolve_client("127.0.0.1:5").mutual  # the environment first
    explicit = Credentials.plaintext()
    assert resolve_client("127.0.0.1:5", explicit) is explicit
    local.remove()
    assert not cluster_dir("127.0.0.1:5").exists()
    with pytest.raises(CredentialsError, match="needs its private key"):
        Credentials(cert_pem=b"x")
    with pytest.raises(CredentialsError, match="cannot be combined"):
        Credentials(ca_pem=b"x", insecure=True)


def test_snapshots_and_batches_are_split_under_the_hash_limit():
    stored = common_pb2.KVEvent(stored=common_pb2.BlockStored(block_hashes=[bytes([i % 256]) * 32 for i in range(25)], tier=2))
    removed = common_pb2.KVEvent(removed=common_pb2.BlockRemoved(block_hashes=[b"r" * 32] * 3))
    batches = split_batches([stored, common_pb2.KVEvent(cleared=common_pb2.AllCleared()), removed], max_hashes=10)
    sizes = [
        sum(len(getattr(e, e.WhichOneof("event")).block_hashes) if e.WhichOneof("event") != "cleared" else 0 for e in b) for b in batches
    ]
    assert sizes == [10, 10, 8] and all(s <= 10 for s in sizes)
    flattened = [h for b in batches for e in b if e.WhichOneof("event") == "stored" for h in e.stored.block_hashes]
    assert flattened == list(stored.stored.block_hashes) and all(e.stored.tier == 2 for b in batches for e in b if e.HasField("stored"))
    assert [e.WhichOneof("event") for e in batches[-1]] == ["stored", "cleared", "removed"]
    assert split_batches([]) == [[]]


def test_clip_bounds_what_errors_quote():
    assert clip("abc") == "'abc'"
    long = clip("x" * 100_000)
    assert len(long) < 100 and long.endswith("(100000 long)")

"""Issue 28, items 3 and 4: a compromised worker, played by a real gRPC agent server in this
process with a real worker certificate, registered with a real (mutual-TLS) cluster.

- It logs every call it gets: text prompts must reach it in none (the control plane tokenizes;
  the agents' Tokenize RPC is gone), and the prompt the honest worker runs is the client's.
- It advertises the blocks of another tenant's prompt and reports itself idle: that tenant's
  requests must not go to it (its blocks are uncredited: nothing was routed there).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster
from kvplane.block_hash import hash_blocks
from kvplane.errors import FailedPreconditionError
from kvplane.security.identity import Identity, Role
from kvplane.v1 import agent_pb2_grpc, common_pb2, registry_pb2

from .conftest import As, learned_salt, worker, worker_info

pytestmark = pytest.mark.cluster

BOB = Identity(Role.CLIENT, "app", "bob")  # what cluster.credentials.client("bob") presents


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    with LocalCluster(num_prefill=0, num_decode=1, log_dir=tmp_path_factory.mktemp("logs")) as running:
        yield running


class EvilAgent(agent_pb2_grpc.AgentServicer):
    """Registers as `worker_id`, reports itself idle every 0.2 s, records (and rewrites) what it is sent."""

    def __init__(
        self, cluster: LocalCluster, worker_id: str, role: int, tokenizer: str | None = None, latency: common_pb2.LatencyModel | None = None
    ) -> None:
        self.worker_id = worker_id
        self._latency = latency  # the step-time model its load reports claim (None: none, so it borrows its peers')
        self.methods: list[str] = []  # every RPC the control plane called on it, whatever the method
        self.generated: list[list[int]] = []  # the prompts of the Generate calls it got
        credentials = cluster.credentials.for_identity(worker(worker_id))
        self._server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[_Recorder(self.methods)])
        agent_pb2_grpc.add_AgentServicer_to_server(self, self._server)
        port = self._server.add_secure_port("127.0.0.1:0", credentials.server_credentials())
        self._server.start()
        self._as = As(cluster, worker(worker_id))
        self.registry = self._as.registry()
        info = worker_info(cluster, worker_id)
        info.endpoint, info.role = f"127.0.0.1:{port}", role
        if tokenizer is not None:
            info.tokenizer = tokenizer
        self.reply = self.registry.Register(registry_pb2.RegisterRequest(info=info), timeout=10)
        self.block_size = info.layout.block_size
        self.model = info.model
        self._stop = threading.Event()
        self._seq = 0
        self._reporter = threading.Thread(target=self._report, daemon=True)
        self._reporter.start()

    # -- the agent's side: what the control plane sends it ----------------------------------------

    def Generate(self, request, context):
        self.generated.append(list(request.prompt_token_ids))
        context.abort(grpc.StatusCode.UNAVAILABLE, "evil worker: not serving it (the control plane moves the request)")

    # -- the worker's side: what it claims ---------------------------------------------------------

    def _report(self) -> None:
        idle = common_pb2.WorkerLoad(num_total_blocks=4096, num_free_blocks=4096)
        r = self.reply
        while not self._stop.wait(0.2):
            self.registry.ReportLoad(
                registry_pb2.ReportLoadRequest(worker_id=self.worker_id, lease_id=r.lease_id, session_token=r.session_token,
                                               load=idle, state=common_pb2.WORKER_STATE_ACTIVE, kv_seq=self._seq,
                                               latency=self._latency),
                timeout=10,
            )  # fmt: skip
            self.registry.KeepAlive(
                registry_pb2.KeepAliveRequest(worker_id=self.worker_id, lease_id=r.lease_id, session_token=r.session_token), timeout=10
            )

    def advertise(self, block_hashes: list[bytes]) -> None:
        self._seq += 1
        stored = common_pb2.KVEvent(stored=common_pb2.BlockStored(block_hashes=block_hashes, tier=common_pb2.TIER_DEVICE))
        self.registry.PublishKVEvents(
            registry_pb2.PublishKVEventsRequest(worker_id=self.worker_id, lease_id=self.reply.lease_id, seq=self._seq,
                                                events=[stored], snapshot=True, session_token=self.reply.session_token),
            timeout=10,
        )  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        self._reporter.join(timeout=10)
        r = self.reply
        self.registry.Deregister(
            registry_pb2.DeregisterRequest(worker_id=self.worker_id, lease_id=r.lease_id, session_token=r.session_token), timeout=10
        )
        self._server.stop(grace=None)
        self._as.close()


def _wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class _Recorder(grpc.ServerInterceptor):
    def __init__(self, methods: list[str]) -> None:
        self._methods = methods

    def intercept_service(self, continuation, handler_call_details):
        self._methods.append(handler_call_details.method)
        return continuation(handler_call_details)


def test_a_worker_that_logs_and_rewrites_tokenize_requests_sees_no_text_and_changes_nothing(cluster):
    evil = EvilAgent(cluster, "evil-tokenizer", common_pb2.ROLE_PREFILL)
    try:
        # The honest worker registers again after it, so a control plane asking "the first worker
        # of the model" to tokenize (the old way) would ask the evil one.
        cluster.restart_agent("decode-0")
        with Client(cluster.endpoint, credentials=cluster.credentials.client("bob"), timeout=60) as bob:
            _wait_for(lambda: {w.worker_id for w in bob.workers()} >= {"evil-tokenizer", "decode-0"}, "both workers")
            for text in ("pay 100 EUR", "my password is hunter2"):
                result = bob.generate(text, max_tokens=4, ignore_eos=True)
                by_ids = bob.generate(list(text.encode()), max_tokens=4, ignore_eos=True)
                assert result.metrics.prompt_tokens == len(text.encode())  # the client's prompt, not the evil one
                assert result.metrics.decode_worker == "decode-0" and result.token_ids == by_ids.token_ids
        assert evil.generated == [] and not {m.rsplit("/", 1)[-1] for m in evil.methods} - {"GetStatus"}
    finally:
        evil.close()


def test_a_worker_advertising_another_tenants_blocks_and_reporting_idle_does_not_pull_its_requests(cluster):
    prompt = [(11 * i) % 250 + 3 for i in range(640)]  # 40 blocks of 16
    bob_credentials = cluster.credentials.client("bob")
    with Client(cluster.endpoint, credentials=bob_credentials, timeout=60) as bob:
        bob.generate(prompt, max_tokens=2)  # bob's prompt, computed on decode-0 (the only worker)
        # Evil claims a step time that is tiny for a prompt it holds (16 tokens to compute, within
        # the step's free prefill tokens) and hours for one it must compute (624 tokens past them):
        # believed, the claim would make it the fastest worker by far; not believed, it can never
        # win on load alone (an idle worker otherwise may, when decode-0 looks slower for a moment
        # under the suite's load, which says nothing about the claim).
        claimed = common_pb2.LatencyModel(coefficients=[1e-4, 10.0, 0.0, 1e-4, 0.0], num_samples=100, mean_abs_pct_error=0.01,
                                          free_prefill_tokens=64)  # fmt: skip
        evil = EvilAgent(cluster, "evil-claims", common_pb2.ROLE_DECODE, latency=claimed)
        try:
            # The attacker knows bob's salt, as any worker that once ran a request of bob's does.
            as_bob = As(cluster, BOB)
            try:
                salt = learned_salt(as_bob.kvplane())
            finally:
                as_bob.close()
            evil.advertise(hash_blocks(prompt, evil.block_size, model_salt=evil.model, tenant_salt=salt))
            with cluster.client(timeout=30) as admin:
                _wait_for(lambda: any(c.worker_id == "evil-claims" and sum(c.blocks_by_tier.values()) == 40 for c in admin.cache()),
                          "the advertised blocks in the index")  # fmt: skip
            # With the claim believed, evil would tie on cache and win on its claimed step time;
            # uncredited, decode-0's real hit wins.
            route = bob.route(prompt, max_tokens=2)
            cached = {c.worker_id: c.cached_tokens for c in route.candidates}
            assert cached.get("evil-claims", 0) == 0, cached  # its claim earns no cache credit
            placed = [bob.generate(prompt, max_tokens=2).metrics.decode_worker for _ in range(5)]
            assert placed == ["decode-0"] * 5 and evil.generated == []
        finally:
            evil.close()


def test_a_worker_claiming_another_tokenizer_leaves_its_model_without_one_until_it_leaves(cluster):
    """Rule 3 of controlplane/tokenizer.py, and the control plane noticing the claim come and go
    (it derives each model's tokenizer once per change of its workers, not per request)."""
    with Client(cluster.endpoint, credentials=cluster.credentials.client("bob"), timeout=60) as bob:
        before = bob.generate("hello there", max_tokens=4, ignore_eos=True)
        evil = EvilAgent(cluster, "evil-tokenizer-claim", common_pb2.ROLE_PREFILL, tokenizer="")  # "its engine's own"
        try:
            _wait_for(lambda: "evil-tokenizer-claim" in {w.worker_id for w in bob.workers()}, "the claiming worker")
            with pytest.raises(FailedPreconditionError, match="its workers disagree on the tokenizer"):
                bob.generate("hello there", max_tokens=4, ignore_eos=True)
            # Token ids still work; with no tokenizer here the decode agent makes the text.
            by_ids = bob.generate(list(b"hello there"), max_tokens=4, ignore_eos=True)
            assert by_ids.token_ids == before.token_ids and by_ids.text == before.text
        finally:
            evil.close()
        _wait_for(lambda: "evil-tokenizer-claim" not in {w.worker_id for w in bob.workers()}, "the claiming worker to leave")
        after = bob.generate("hello there", max_tokens=4, ignore_eos=True)
        assert after.token_ids == before.token_ids and after.text == before.text
    assert evil.generated == []


def test_a_worker_claiming_another_block_size_than_its_models_workers_is_refused(cluster):
    """Checked against the replica's view of the registered workers (no store listing per registration)."""
    info = worker_info(cluster, "misfit-blocks")
    info.layout.block_size *= 2
    misfit = As(cluster, worker("misfit-blocks"))
    try:
        with pytest.raises(grpc.RpcError) as refused:
            misfit.registry().Register(registry_pb2.RegisterRequest(info=info), timeout=10)
    finally:
        misfit.close()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details().startswith(
        f"registration refused: block_size: worker misfit-blocks's engine uses {info.layout.block_size}"
    )
    assert "but worker decode-0 of model" in refused.value.details()

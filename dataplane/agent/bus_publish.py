"""Load reports and KV event batches published straight to the control plane's NATS bus, when
registration names one (RegisterResponse.bus_url, `kvplane controlplane --bus-for-agents`).

A message through a replica costs that replica a gRPC call, a publish and its own copy coming back
(about 0.5 ms of its CPU for a load report at 128 workers); published here, every replica only
reads it from the bus. Each carries its MAC, keyed by this registration's session token
(kvplane/bus.py), and its number (`report_seq`, a batch's `seq`), so no other worker can publish
one in its name or replay one; every replica checks a batch's limits before it applies it, as the
replica answering a PublishKVEvents call does. Load reports are fire and forget, as the replicas'
own are: the next supersedes a lost one. A KV batch waits for JetStream's acknowledgement (a
report must never name a batch the stream may not hold), and after a snapshot the batches before
it are purged from the stream, as a replica publishing one does. While NATS cannot be reached, or
does not take a batch, the link sends it through its replica (the publish methods answer False).
Lease keep-alives are NATS requests that one replica answers (controlplane/bus_keepalives.py);
without an answer the link sends the keep-alive as a gRPC call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
import time

from kvplane import bus
from kvplane.security.credentials import Credentials
from kvplane.v1 import registry_pb2

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
ACK_TIMEOUT_S = 2.0  # JetStream's acknowledgement of a KV batch; longer, and the batch goes through a replica
NO_RESPONDERS_RETRY_S = 60.0  # no replica took a keep-alive on the bus: gRPC only, for this long


class BusPublisher:
    def __init__(self, url: str, credentials: Credentials, worker_id: str) -> None:
        self.url = url
        self._credentials = credentials
        self._name = f"kvplane-agent {worker_id}"  # how NATS lists the connection (its monitoring, `nats server report`)
        self._nc = None
        self._js = None
        self._keepalives_off_until = 0.0  # monotonic: until then keep-alives go over gRPC (no replica took one here)

    async def start(self) -> bool:
        """Connects; False (said in the log) when nats-py is missing or NATS cannot be reached."""
        try:
            from nats.aio.client import Client  # the server extra's dependency
        except ImportError:
            log.warning(
                "the control plane asks for load reports on its bus at %s, but nats-py is not installed here; reporting through a replica",
                self.url,
            )
            return False
        client = Client()
        servers = bus.server_urls(self.url)
        try:
            tls = self._tls() if self.url.startswith("tls://") else None
            await asyncio.wait_for(
                client.connect(
                    servers=servers,
                    tls=tls,
                    name=self._name,
                    inbox_prefix=bus.AGENT_INBOX_PREFIX,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    max_reconnect_attempts=2,
                    reconnect_time_wait=0.5,
                ),
                4 * CONNECT_TIMEOUT_S,
            )
        except Exception as e:
            with contextlib.suppress(Exception):
                await client.close()
            log.warning("cannot reach the bus at %s (%r); reporting through a replica", self.url, e)
            return False
        client.options["max_reconnect_attempts"] = -1  # connected once: from now on, reconnect for ever
        self._nc, self._js = client, client.jetstream(timeout=ACK_TIMEOUT_S)
        log.info("publishing load reports and KV event batches to the bus at %s", self.url)
        return True

    async def publish_load(self, report: registry_pb2.ReportLoadRequest, session_token: bytes) -> bool:
        """Publishes `report` (without its session token) with its MAC; False while disconnected."""
        nc = self._nc
        if nc is None or not nc.is_connected:
            return False
        report.ClearField("session_token")
        payload = report.SerializeToString()
        try:
            await nc.publish(bus.subject("load", report.worker_id), payload, headers=_signed(session_token, "load", payload))
        except Exception as e:
            log.debug("publishing a load report to the bus failed: %r", e)
            return False
        return True

    async def publish_kv(self, batch: registry_pb2.PublishKVEventsRequest, session_token: bytes) -> bool:
        """Publishes `batch` (without its session token) with its MAC and waits for the stream to
        take it; False when it did not (disconnected, no answer in time, no stream)."""
        nc = self._nc
        if nc is None or not nc.is_connected:
            return False
        batch.ClearField("session_token")
        payload, subject = batch.SerializeToString(), bus.subject("kv", batch.worker_id)
        try:
            ack = await self._js.publish(subject, payload, stream=bus.KV_STREAM, headers=_signed(session_token, "kv", payload))
        except Exception as e:
            log.info("the bus did not take KV batch %d (%r); sending it through a replica", batch.seq, e)
            return False
        if batch.snapshot:
            try:
                await bus.purge_before_snapshot(self._js, subject, ack.seq)
            except Exception as e:  # they stay until age or size drops them: a replica replays more, nothing is lost
                log.warning("purging the KV batches before our snapshot failed: %r", e)
        return True

    def keepalives_off(self) -> bool:
        """Whether keep-alives go over gRPC for now (no replica took one on the bus lately)."""
        return time.monotonic() < self._keepalives_off_until

    async def keep_alive(self, request: registry_pb2.KeepAliveRequest, session_token: bytes, timeout_s: float):
        """Renews the lease through a replica on the bus (kvplane/bus.py): the KeepAliveResponse, or
        None when none came (disconnected, no replica serves keep-alives there, no answer in time,
        or a replica's error), and the link asks over gRPC."""
        nc = self._nc
        if nc is None or not nc.is_connected or self.keepalives_off():
            return None
        from nats.errors import NoRespondersError

        request.ClearField("session_token")
        payload = request.SerializeToString()
        try:
            reply = await nc.request(
                bus.subject("keepalive", request.worker_id),
                payload,
                timeout=timeout_s,
                headers=_signed(session_token, "keepalive", payload),
            )
        except NoRespondersError:  # replicas that do not take keep-alives on the bus (an older version)
            self._keepalives_off_until = time.monotonic() + NO_RESPONDERS_RETRY_S
            log.info("no replica takes keep-alives on the bus; sending them over gRPC for %.0f s", NO_RESPONDERS_RETRY_S)
            return None
        except Exception as e:
            log.debug("a keep-alive on the bus got no answer (%r); sending it over gRPC", e)
            return None
        error = (reply.headers or {}).get(bus.ERROR_HEADER)
        if error is not None:
            log.debug("a replica did not renew our lease on the bus (%s); asking over gRPC", error)
            return None
        return registry_pb2.KeepAliveResponse.FromString(reply.data)

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()

    def _tls(self) -> ssl.SSLContext:
        """TLS with this agent's own certificate (NATS may verify clients) and CA."""
        c = self._credentials
        context = ssl.create_default_context(cadata=c.ca_pem.decode() if c.ca_pem else None)
        if c.cert_pem and c.key_pem:
            # ssl loads a certificate chain from files only: a private temporary directory, removed at once.
            with tempfile.TemporaryDirectory() as folder:
                cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
                for path, data in ((cert, c.cert_pem), (key, c.key_pem)):
                    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                        f.write(data)
                context.load_cert_chain(cert, key)
        return context


def _signed(session_token: bytes, kind: str, payload: bytes) -> dict[str, str]:
    return {bus.MAC_HEADER: bus.mac(session_token, kind, payload)}

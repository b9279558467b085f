"""A KV-event publisher speaking the engines' ZMQ protocol (PUB + a replay ROUTER), for tests of
the subscriber: real sockets on loopback, with batches that can be withheld from the live stream
(lost) and a bounded replay buffer (history that is gone). Mirrors the framing of vLLM's and
SGLang's ZmqEventPublisher: [topic, seq (8 bytes, big-endian), msgpack [ts, events, dp_rank]];
a replay request is ["", start_seq]; replies [identity, "", topic, seq, payload], then seq -1.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import msgpack
import zmq


class Publisher:
    def __init__(self, buffer_steps: int = 100, topic: bytes = b"") -> None:
        # Bound to ports ZMQ picks: a free_port() another test process took before the bind
        # failed a run with "Address already in use".
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self.endpoint = f"tcp://127.0.0.1:{self._pub.bind_to_random_port('tcp://127.0.0.1')}"
        self._router = self._ctx.socket(zmq.ROUTER)
        self.replay_endpoint = f"tcp://127.0.0.1:{self._router.bind_to_random_port('tcp://127.0.0.1')}"
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._topic = topic
        self._seq = 0
        self._lock = threading.Lock()
        self.replay_requests: list[int] = []
        self._running = True
        self._thread = threading.Thread(target=self._serve_replays, daemon=True)
        self._thread.start()

    def publish(self, events: list, *, lost: bool = False, ts: float | None = None) -> int:
        """Sends one batch (or only buffers it, when `lost`); returns its sequence number."""
        with self._lock:
            seq = self._seq
            self._seq += 1
            payload = msgpack.packb([time.time() if ts is None else ts, events, 0])
            self._buffer.append((seq, payload))
            if not lost:
                self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
            return seq

    def restart(self) -> None:
        """As a restarted engine: numbering from 0, an empty buffer."""
        with self._lock:
            self._seq = 0
            self._buffer.clear()

    def _serve_replays(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while self._running:
            if not poller.poll(50):
                continue
            identity, _, start = self._router.recv_multipart()
            start_seq = int.from_bytes(start, "big", signed=True)
            self.replay_requests.append(start_seq)
            with self._lock:
                for seq, payload in list(self._buffer):
                    if seq >= start_seq:
                        self._router.send_multipart([identity, b"", self._topic, seq.to_bytes(8, "big"), payload])
            self._router.send_multipart([identity, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=2)
        self._pub.close(linger=0)
        self._router.close(linger=0)
        self._ctx.term()


def stored(block_hashes: list, token_ids: list[int], parent=None, block_size: int = 4, medium: str = "GPU", **extra) -> dict:
    return {"type": "BlockStored", "block_hashes": block_hashes, "parent_block_hash": parent, "token_ids": token_ids,
            "block_size": block_size, "lora_id": None, "medium": medium, **extra}  # fmt: skip


def removed(block_hashes: list, medium: str = "GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": block_hashes, "medium": medium}

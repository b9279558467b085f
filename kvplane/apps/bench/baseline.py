"""Raw baselines for the KV transfer benchmark, measured in the same run as the transports.

memcpy: torch copy_ between two preallocated CPU tensors (the ceiling for any DRAM->DRAM move).
tcp: a real second OS process sends the bytes over a loopback TCP socket and this process
recv_into()s a preallocated buffer (the ceiling for a socket-based stream such as gRPC).
Both return (bytes moved, seconds spent moving them); one untimed warm-up round goes first.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import torch

# The sender runs as `python -c`: no project imports, so it starts in milliseconds.
_SENDER = r"""
import socket, sys
port, nbytes = int(sys.argv[1]), int(sys.argv[2])
payload = memoryview(bytearray(b"\x5a" * nbytes))
with socket.create_connection(("127.0.0.1", port)) as conn:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while conn.recv(1) == b"g":  # one "go" byte per round; EOF ends the sender
        conn.sendall(payload)
"""


def _check_args(nbytes: int, repeats: int) -> None:
    if nbytes <= 0 or repeats <= 0:
        raise ValueError(f"nbytes and repeats must be positive, got nbytes={nbytes}, repeats={repeats}")


def measure_memcpy(nbytes: int, repeats: int) -> tuple[int, float]:
    _check_args(nbytes, repeats)
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    dst.copy_(src)  # warm-up: touches every page of dst
    started = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    return nbytes * repeats, time.perf_counter() - started


def measure_tcp(nbytes: int, repeats: int, timeout_s: float = 60.0) -> tuple[int, float]:
    _check_args(nbytes, repeats)
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(timeout_s)
        sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(listener.getsockname()[1]), str(nbytes)])
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(timeout_s)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _receive_round(conn, view, nbytes)  # warm-up
                elapsed = 0.0
                for _ in range(repeats):
                    started = time.perf_counter()
                    _receive_round(conn, view, nbytes)
                    elapsed += time.perf_counter() - started
            if buffer[0] != 0x5A or buffer[-1] != 0x5A:
                raise RuntimeError("the TCP baseline received bytes other than those sent")
        finally:
            try:
                sender.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sender.kill()
                sender.wait()
    return nbytes * repeats, elapsed


def _receive_round(conn: socket.socket, view: memoryview, nbytes: int) -> None:
    conn.sendall(b"g")
    received = 0
    while received < nbytes:
        n = conn.recv_into(view[received:], nbytes - received)
        if n == 0:
            raise RuntimeError(f"the TCP baseline sender closed after {received} of {nbytes} bytes")
        received += n

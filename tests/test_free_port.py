"""kvplane.apps.cluster.free_port: ports for child processes, drawn outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from kvplane.apps.cluster import LOCALHOST, _ephemeral_low, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    low = _ephemeral_low()
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # drawn at random, not handed out in order
    for port in ports:
        assert 20000 <= port < low
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, ports.pop()))


def test_a_taken_port_is_never_returned(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((LOCALHOST, 0))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken, taken, taken + 1])
        monkeypatch.setattr("random.SystemRandom.randrange", lambda self, a, b: next(draws))
        assert free_port() == taken + 1

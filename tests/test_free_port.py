"""kvplane.apps.cluster.free_port: ports for child processes, drawn outside the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

import pytest

from kvplane.apps.cluster import FREE_PORTS_ENV, LOCALHOST, _ephemeral_low, free_port, free_port_range


def test_free_ports_are_below_the_ephemeral_range_and_bindable(monkeypatch):
    monkeypatch.delenv(FREE_PORTS_ENV, raising=False)
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
        # The first two draws hit the held port; the later ones draw as usual (a fixed third port,
        # taken + 1, can itself be in use by another process: seen in CI).
        real_draw, draws = random.SystemRandom.randrange, []

        def draw(self, low, high):
            draws.append(taken if len(draws) < 2 else real_draw(self, low, high))
            return draws[-1]

        monkeypatch.setattr("random.SystemRandom.randrange", draw)
        port = free_port()
        assert draws[:2] == [taken, taken] and len(draws) >= 3 and port == draws[-1] != taken


def test_the_environment_gives_the_range_to_draw_from(monkeypatch):
    monkeypatch.setenv(FREE_PORTS_ENV, "23000-23100")
    assert free_port_range() == (23000, 23100)
    assert all(23000 <= free_port() < 23100 for _ in range(20))
    for bad in ("23000", "x-y", "23100-23000", "80-90"):
        monkeypatch.setenv(FREE_PORTS_ENV, bad)
        with pytest.raises(ValueError, match=FREE_PORTS_ENV):
            free_port()


def test_a_cluster_never_hands_out_a_port_it_gave_before(monkeypatch):
    """`kvplane up --port P` drew P again for an agent before the control plane had bound it (the
    agent failed to bind): LocalCluster skips the ports it was given and the ones it drew."""
    from kvplane.apps import cluster

    given = free_port()
    draws = iter([given, given, given + 1, given + 1, given + 2])
    monkeypatch.setattr(cluster, "free_port", lambda: next(draws))
    local = cluster.LocalCluster(num_prefill=1, num_decode=1, port=given)
    assert [local._free_port(), local._free_port()] == [given + 1, given + 2]

"""Issue 28, item 8: the SDK rides through a control plane that restarts within a few seconds
(before, a call made while it was down failed at once). A real replica is stopped, and another
takes its port half a second later, while a call is waiting to reach it."""

from __future__ import annotations

import threading
import time

from kvplane import Client
from kvplane.apps.cluster import free_port
from kvplane.security.credentials import Credentials

from .servers import TOKEN, control_plane


def test_a_call_made_while_the_control_plane_restarts_is_answered_after_it_is_back():
    port = free_port()
    with Client(f"127.0.0.1:{port}", credentials=Credentials.plaintext(TOKEN), timeout=30) as client:
        with control_plane(port=port):
            assert client.workers() == []
        outcome: list = []
        started = time.monotonic()

        def call() -> None:
            try:
                outcome.append(client.workers())
            except Exception as e:  # noqa: BLE001 - the test reports what the call raised
                outcome.append(e)
            outcome.append(time.monotonic() - started)

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(0.5)  # the replica is down: the call's first attempts are refused
        with control_plane(port=port):
            caller.join(30)
        assert outcome and outcome[0] == [], outcome
        print(f"answered {outcome[1]:.2f} s after the call began (replica down for 0.5 s and its start)")

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sdk.scripted_server import ScriptedServer


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer().start()
    yield scripted
    scripted.stop()

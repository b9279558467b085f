"""Engine test fixtures: a tiny HF Llama checkpoint (session) and started engines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvplane.dataplane.engines.reference import Engine, EngineConfig

from .helpers import load_hf, write_hf_llama


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_llama(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.fixture(scope="session")
def hf_model(hf_dir: Path):  # type: ignore[no-untyped-def]
    return load_hf(hf_dir)


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    """Builds started engines (small pools by default) and stops them after the test."""
    engines: list[Engine] = []

    def make(start: bool = True, **overrides: object) -> Engine:
        kwargs: dict[str, object] = dict(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=256)
        kwargs.update(overrides)
        engine = Engine(EngineConfig(**kwargs))  # type: ignore[arg-type]
        engines.append(engine)
        if start:
            engine.start()
        return engine

    yield make
    for engine in engines:
        engine.stop()

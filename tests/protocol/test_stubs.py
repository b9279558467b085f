"""The checked-in Python stubs are exactly what protoc generates from protos/ today."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplane.apps.protogen import ROOT, generate, proto_files


@pytest.mark.cluster
def test_generated_stubs_are_not_stale(tmp_path: Path):
    generate(tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "protoc generated nothing"
    for relative in generated:
        checked_in = ROOT / relative
        assert checked_in.exists(), f"{relative} is not checked in: run `make protos` and commit"
        assert checked_in.read_bytes() == (tmp_path / relative).read_bytes(), (
            f"{relative} is stale against protos/: run `make protos` and commit"
        )


def test_every_proto_file_has_stubs():
    for proto in proto_files():
        stem = proto.relative_to(ROOT / "protos").with_suffix("")
        assert (ROOT / f"{stem}_pb2.py").exists(), f"no stub for {proto}"

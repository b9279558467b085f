"""`kvplane bench tiers --overlap` in process, small: both load paths measured, every load moves
the whole prefix from the host tier, and bad arguments are refused with exit status 2.
The latencies themselves are the benchmark's business (docs/benchmarks.md), not asserted here."""

from __future__ import annotations

import argparse
import json

import pytest

from kvplane.apps.bench import tiers


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tiers.add_arguments(parser)
    return parser.parse_args(["--overlap", "--overlap-model", "builtin-tiny", *argv])


def test_overlap_measures_both_paths_with_whole_prefix_loads(capsys) -> None:
    # Four prefixes of 4 blocks: the three loaded since a prefix's last use fill the device pool's
    # slack (4 blocks, and a block more while the stream is shorter than its longest), so none of
    # its blocks is left there (with three, one could be).
    args = _args("--prefix-tokens", "64", "--prefixes", "4", "--decode-tokens", "8", "--rounds", "1", "--host-gbs", "0", "--json")
    assert tiers.run(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert [row["path"] for row in result["rows"]] == ["in-step", "copy thread"]
    assert result["load_mib"] == 4 * 8 * 1024 / 2**20  # 4 blocks of 8 KiB (builtin-tiny, 16 tokens a block)
    for row in result["rows"]:
        assert row["loads"] >= 1 and row["blocks_per_load"] == 4  # never a partial load: the prefix left the device
        assert row["device_condition_loads"] == 0  # and the "device" condition's prefix never did
        for condition in ("alone", "device", "host"):
            assert row[f"itl_{condition}_p50_ms"] > 0
        assert row["p99_ratio"] == row["itl_host_p99_ms"] / row["itl_alone_p99_ms"]
        assert row["p99_ratio_to_device"] == row["itl_host_p99_ms"] / row["itl_device_p99_ms"]
    assert result["target_met"] == (result["rows"][1]["p99_ratio_to_device"] <= 1.2)


@pytest.mark.parametrize("argv", [("--prefix-tokens", "100"), ("--prefixes", "1"), ("--decode-tokens", "2"), ("--host-gbs", "-1")])
def test_overlap_refuses_bad_arguments(argv: tuple[str, ...], capsys) -> None:
    assert tiers.run(_args(*argv)) == 2
    assert "kvplane bench tiers --overlap:" in capsys.readouterr().err

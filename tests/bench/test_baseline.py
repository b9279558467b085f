"""Raw baselines of the transfer benchmark: both report the bytes they moved and a positive time."""

from __future__ import annotations

import pytest

from kvplane.apps.bench.baseline import measure_memcpy, measure_tcp

NBYTES = 4 << 20


def test_memcpy_moves_the_requested_bytes():
    moved, seconds = measure_memcpy(NBYTES, repeats=3)
    assert moved == 3 * NBYTES
    assert seconds > 0
    assert moved / seconds > 1e8  # even a slow CI machine copies DRAM faster than 100 MB/s


@pytest.mark.cluster
def test_tcp_moves_the_requested_bytes_through_a_second_process():
    moved, seconds = measure_tcp(NBYTES, repeats=3)
    assert moved == 3 * NBYTES
    assert seconds > 0
    assert moved / seconds > 1e7


@pytest.mark.parametrize("measure", [measure_memcpy, measure_tcp])
def test_baselines_refuse_empty_work(measure):
    with pytest.raises(ValueError, match="nbytes and repeats must be positive, got nbytes=0, repeats=1"):
        measure(0, 1)

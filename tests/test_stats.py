"""The one percentile definition (kvplane.stats), with exact values."""

from __future__ import annotations

import pytest

from kvplane.stats import percentile


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    assert percentile(list(range(101)), 90) == 90.0
    with pytest.raises(ValueError):
        percentile(values, 101)

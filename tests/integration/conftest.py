"""Real local clusters (control plane + agent processes over loopback) for end-to-end tests."""

from __future__ import annotations

import pytest

from kvplane.apps.cluster import LocalCluster


@pytest.fixture(scope="module")
def disagg_cluster():
    """One prefill and one decode agent on the embedded store, every transport available."""
    with LocalCluster(num_prefill=1, num_decode=1, controlplane_args=("--disagg-threshold", "64")) as cluster:
        yield cluster

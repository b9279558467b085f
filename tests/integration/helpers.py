"""Helpers for end-to-end tests against real local clusters."""

from __future__ import annotations

import random
import ssl
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

BLOCK_SIZE = 16  # the engine's default, which these clusters use


def prompt_ids(seed: int, length: int, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Polls `predicate` until it returns a truthy value; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def cached_blocks(client, worker_id: str) -> int:
    for wc in client.cache():
        if wc.worker_id == worker_id:
            return sum(wc.blocks_by_tier.values())
    return 0


def https_context(cluster) -> ssl.SSLContext:
    """An SSL context that trusts a LocalCluster's CA: its HTTP API serves HTTPS."""
    return ssl.create_default_context(cafile=cluster.http_ca)


def scrape(url: str, cafile: str | None = None) -> dict[str, float]:
    """Prometheus samples as {'name{k="v",...}': value}, labels sorted, scope labels dropped
    (`cafile`: the CA an https URL is verified against, e.g. a LocalCluster's http_ca)."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    text = urllib.request.urlopen(url, timeout=5, context=context).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if not k.startswith("otel_scope"))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def metric_sum(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and all(w in k for w in wanted))

"""The shipped monitoring against a real Prometheus (`make prometheus` installs it): promtool accepts
the rules; a Prometheus run with deploy/monitoring/prometheus.yml (intervals shortened to 1 s, alert
`for:` to 1 s) scrapes a local cluster of sim-engine agents; every recording rule and every
dashboard panel's query returns a series; KvplaneNoWorkers fires when the workers stop and clears
when they are back."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from kvplane.apps.cluster import LocalCluster, free_port

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
sys.path.insert(0, str(MONITORING))
import rules  # noqa: E402  (deploy/monitoring/rules.py is a script)

pytestmark = pytest.mark.cluster
SIM = ("--engine", "sim", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--sim-num-blocks", "512", "--speedup", "8")
GRAFANA_MACROS = {"$__rate_interval": "1m", "$__interval": "1m"}


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: `make prometheus` installs it", pytrace=False)
    return found


def _write_rules(path: Path, for_: str | None = None) -> dict:
    groups = rules.rule_groups()
    if for_ is not None:  # the test cannot wait minutes: alerts hold for `for_` instead
        for group in groups["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = for_
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return groups


def test_promtool_accepts_the_rules(tmp_path):
    path = tmp_path / "kvplane-rules.yml"
    groups = _write_rules(path)
    done = subprocess.run([_tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups['groups'])} rules found" in done.stdout


class Prometheus:
    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.log = (directory / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [_tool("prometheus"), f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def get(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list:
        return self.get("/api/v1/query", query=expr)["result"]

    def wait_for(self, what: str, check, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = check()
            except OSError:
                found = None
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus: no {what} within {timeout:.0f} s")
            time.sleep(0.5)

    def firing(self, alert: str) -> bool:
        return any(a["labels"]["alertname"] == alert and a["state"] == "firing" for a in self.get("/api/v1/alerts")["alerts"])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def test_prometheus_scrapes_a_cluster_and_rules_dashboard_and_alerts_work(tmp_path):
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["scrape_configs"][0]["file_sd_configs"][0]["refresh_interval"] = "1s"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    groups = _write_rules(tmp_path / config["rule_files"][0], for_="1s")
    (tmp_path / "targets").mkdir()
    with LocalCluster(num_prefill=1, num_decode=1, agent_args=SIM, controlplane_args=("--disagg-threshold", "64")) as cluster:
        with cluster.client(timeout=60) as client:
            targets = [client.stats().metrics_url, *(w.metrics_url for w in client.workers())]
            (tmp_path / "targets" / "kvplane.json").write_text(
                json.dumps([{"targets": [urllib.parse.urlsplit(u).netloc for u in targets]}])
            )
            prometheus = Prometheus(tmp_path)
            try:
                for i in range(12):  # local and disaggregated requests, several tokens each
                    client.generate(list(range(10 + i, 210 + i)), max_tokens=4, disagg="always" if i % 2 else "never")
                prometheus.wait_for("three targets up", lambda: len(prometheus.query("up == 1")) == 3)
                prometheus.wait_for(
                    "two scrapes of the requests", lambda: prometheus.query("count_over_time(kvplane_output_tokens_total[1m]) >= 2")
                )
                for i in range(12):  # more traffic after the first scrapes: rates over them are > 0
                    client.generate(list(range(20 + i, 220 + i)), max_tokens=4, disagg="always" if i % 2 else "never")
                time.sleep(3)
                records = [r["record"] for g in groups["groups"] for r in g["rules"] if "record" in r]
                for record in records:
                    prometheus.wait_for(f"series of {record}", lambda record=record: prometheus.query(record), timeout=20)
                dashboard = json.loads((MONITORING / "dashboard.json").read_text())
                for panel in dashboard["panels"]:
                    for target in panel["targets"]:
                        expr = target["expr"]
                        for macro, value in GRAFANA_MACROS.items():
                            expr = expr.replace(macro, value)
                        assert prometheus.query(expr), f"panel {panel['title']!r}: {expr} returned no series"
                assert not prometheus.firing("KvplaneNoWorkers")

                workers = ["prefill-0", "decode-0"]
                for name in workers:
                    cluster.kill(name, sig=signal.SIGTERM)  # each deregisters on its way out
                prometheus.wait_for("KvplaneNoWorkers firing", lambda: prometheus.firing("KvplaneNoWorkers"), timeout=60)
                prometheus.wait_for("the workers' exit", lambda: set(workers) <= set(cluster.exited()), timeout=30)
                for name in workers:
                    cluster.respawn(name)
                cluster.wait_until_registered(60)
                prometheus.wait_for("KvplaneNoWorkers cleared", lambda: not prometheus.firing("KvplaneNoWorkers"), timeout=60)
            finally:
                prometheus.stop()

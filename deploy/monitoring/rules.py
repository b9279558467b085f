"""Writes kvplane's rules as a plain Prometheus rule file (the PrometheusRule's spec, the one source).

python deploy/monitoring/rules.py > kvplane-rules.yml     # then rule_files: [kvplane-rules.yml]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

SOURCE = Path(__file__).resolve().parent / "prometheusrule.yaml"


def rule_groups() -> dict:
    return {"groups": yaml.safe_load(SOURCE.read_text())["spec"]["groups"]}


if __name__ == "__main__":
    yaml.safe_dump(rule_groups(), sys.stdout, sort_keys=False, width=1000)

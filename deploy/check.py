"""Offline checks of deploy/: every YAML file parses, every kvplane command line in
compose.yaml and k8s/*.yaml is accepted by the real argument parsers and config validation, and
no agent container is given the admin token (workers get worker credentials only: a compromised
worker must not drain, profile or reconfigure the cluster).

Run from the repository root with the project's venv: `python deploy/check.py`.
It needs no Docker, Kubernetes or etcd, and proves nothing about running them.
tests/deploy/test_deploy.py runs these checks and validates every Kubernetes object against the
API schema (kubernetes-validate, offline).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from kvplane.controlplane import main as controlplane_main
from kvplane.dataplane.agent import main as agent_main

DEPLOY = Path(__file__).resolve().parent
PARSERS = {"controlplane": controlplane_main, "agent": agent_main}
# Values Kubernetes substitutes at run time, replaced by plausible ones here.
K8S_VARS = {"POD_NAME": "kvplane-worker-7d9f-abcde", "POD_IP": "10.0.0.7"}


def parse(argv: list[str]) -> None:
    module = PARSERS[argv[0]]
    parser = argparse.ArgumentParser(prog=f"kvplane {argv[0]}", exit_on_error=False)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    module.config_from_args(args)  # raises ValueError on a value the config rejects


def command_lines() -> list[tuple[str, list[str]]]:
    found = []
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if service.get("image", "").startswith("kvplane"):
            found.append((f"compose.yaml:{name}", [str(a) for a in service["command"]]))
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "Deployment":
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if not c["image"].startswith("kvplane"):
                    continue  # an engine container beside the agent: not a kvplane command line
                argv = [re.sub(r"\$\((\w+)\)", lambda m: K8S_VARS[m.group(1)], a) for a in c["args"]]
                found.append((f"k8s/{path.name}:{doc['metadata']['name']}/{c['name']}", argv))
                ports = {p["containerPort"] for p in c.get("ports", [])}
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe in c and c[probe]["grpc"]["port"] not in ports:
                        raise SystemExit(f"{path.name}: {c['name']} {probe} port is not a container port")
    return found


def environments() -> list[tuple[str, str, dict[str, str]]]:
    """(where, kvplane command, {variable: where its value comes from}) of every kvplane container:
    a Compose value as written (`${KVPLANE_ADMIN_TOKEN}`), a Kubernetes secret as `secret:NAME/KEY`."""
    found = []
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if service.get("image", "").startswith("kvplane"):
            found.append(
                (f"compose.yaml:{name}", str(service["command"][0]), {k: str(v) for k, v in service.get("environment", {}).items()})
            )
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "Deployment":
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["image"].startswith("kvplane"):
                    env = {e["name"]: _source(e) for e in c.get("env", [])}
                    found.append((f"k8s/{path.name}:{doc['metadata']['name']}/{c['name']}", c["args"][0], env))
    return found


def _source(variable: dict) -> str:
    secret = variable.get("valueFrom", {}).get("secretKeyRef")
    return f"secret:{secret['name']}/{secret['key']}" if secret else str(variable.get("value", ""))


def check_worker_credentials(found: list[tuple[str, str, dict[str, str]]]) -> None:
    """ValueError naming the container when an agent's environment holds the admin token."""
    for where, command, env in found:
        if command != "agent":
            continue
        admin = [k for k, v in env.items() if k == "KVPLANE_ADMIN_TOKEN" or "KVPLANE_ADMIN_TOKEN" in v or v.endswith("/admin")]
        if admin:
            raise ValueError(f"{where}: an agent is given the admin token ({', '.join(admin)}); workers get worker credentials only")


def main() -> int:
    for path in [DEPLOY / "compose.yaml", *sorted((DEPLOY / "k8s").glob("*.yaml"))]:
        list(yaml.safe_load_all(path.read_text()))
    lines = command_lines()
    for where, argv in lines:
        parse(argv)
        print(f"ok  {where}: kvplane {' '.join(argv)}")
    check_worker_credentials(environments())
    print("ok  no agent holds the admin token")
    return 0 if lines else 1


if __name__ == "__main__":
    sys.exit(main())

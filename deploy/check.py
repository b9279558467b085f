"""Offline checks of deploy/: every kustomize overlay renders, and every kvplane command line in
compose.yaml and in the rendered Kubernetes objects is accepted by the real argument parsers and
config validation, with the container's environment applied as the servers apply it
(KVPLANE_FLAG_NAME = --flag-name, kvplane/apps/cli/flag_sources.py).

Run from the repository root with the project's venv: `python deploy/check.py`. It needs
`kubectl` (its built-in kustomize; $KUBECTL names another binary), no cluster, Docker or etcd, and
proves nothing about running them. tests/deploy/test_deploy.py runs these checks and validates
every rendered object against the Kubernetes API schema (kubernetes-validate, offline).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from kvplane.apps.cli import flag_sources
from kvplane.controlplane import main as controlplane_main
from kvplane.dataplane.agent import main as agent_main

DEPLOY = Path(__file__).resolve().parent
OVERLAYS = DEPLOY / "k8s" / "overlays"
PARSERS = {"controlplane": controlplane_main, "agent": agent_main}
# Values Kubernetes fills in at run time (downward API, Secrets), replaced by plausible ones here.
K8S_VARS = {"POD_NAME": "kvplane-decode-0", "POD_NAMESPACE": "kvplane", "POD_IP": "10.0.0.7"}
SECRET_PLACEHOLDER = "0123456789abcdef0123456789abcdef"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def parse(argv: list[str], environ: dict[str, str] | None = None) -> None:
    module = PARSERS[argv[0]]
    parser = argparse.ArgumentParser(prog=f"kvplane {argv[0]}", exit_on_error=False)
    module.add_arguments(parser)
    flag_sources.apply(parser, argv[1:], environ or {})  # as `kvplane controlplane|agent` does
    args = parser.parse_args(argv[1:])
    module.config_from_args(args)  # raises ValueError on a value the config rejects


def overlays() -> list[Path]:
    return sorted(p for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").exists())


def render(overlay: Path, kubectl: str | None = None) -> list[dict]:
    """The objects `kubectl kustomize OVERLAY` renders (kubectl 1.20's kustomize v2 and today's)."""
    kubectl = kubectl or os.environ.get("KUBECTL", "kubectl")
    done = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kubectl} kustomize {overlay} failed: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _environment(container: dict) -> dict[str, str]:
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item.get("valueFrom", {}):
            env[item["name"]] = SECRET_PLACEHOLDER
        else:
            env[item["name"]] = K8S_VARS.get(item["name"], "x")
    return env


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), K8S_VARS.get(m.group(1), m.group(0))), text)


def kubernetes_command_lines(where: str, docs: list[dict]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, argv, environment) of every kvplane container in `docs`; checks its probe ports."""
    found = []
    for doc in docs:
        if doc.get("kind") not in WORKLOADS:
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            ports = {p["containerPort"] for p in c.get("ports", [])} | {p.get("name") for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                for kind in ("grpc", "httpGet", "tcpSocket"):
                    if kind in c.get(probe, {}) and c[probe][kind]["port"] not in ports:
                        raise SystemExit(f"{where}: {doc['metadata']['name']}/{c['name']} {probe} port is not a container port")
            if not c["image"].startswith("kvplane"):
                continue  # an engine or etcd beside kvplane: not a kvplane command line
            env = _environment(c)
            argv = [_expand(a, env) for a in c["args"]]
            found.append((f"{where}:{doc['metadata']['name']}/{c['name']}", argv, env))
    return found


def command_lines() -> list[tuple[str, list[str], dict[str, str]]]:
    found = []
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        # A service with its own entrypoint (the certs script) runs no kvplane server.
        if service.get("image", "").startswith("kvplane") and "entrypoint" not in service:
            found.append((f"compose.yaml:{name}", [str(a) for a in service["command"]], {}))
    for overlay in overlays():
        found += kubernetes_command_lines(f"k8s/overlays/{overlay.name}", render(overlay))
    return found


def compose_certificates(workdir: Path) -> list[tuple[str, list[str], str]]:
    """Runs compose.yaml's `certs` script with the real `kvplane certs` (its /pki in `workdir`)
    and checks that every /pki file a service names (command line or environment) is in the
    volume subpath that service mounts. Returns (service, files it names, subpath) per service."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    script = compose["services"]["certs"]["command"][0]
    pki = workdir / "pki"
    # Compose's $$ is a shell's $; the container's uid does not exist here, so no chown.
    script = script.replace("$$", "$").replace("/pki", str(pki))
    script = "\n".join(line for line in script.splitlines() if not line.strip().startswith("chown "))
    kvplane = str(Path(sys.executable).with_name("kvplane"))
    subprocess.run(["/bin/sh", "-ec", script.replace("kvplane certs", f"{kvplane} certs")], check=True, capture_output=True)
    checked = []
    for name, service in compose["services"].items():
        mounts = [v for v in service.get("volumes", []) if isinstance(v, dict) and v.get("source") == "pki" and v.get("read_only")]
        words = [str(a) for a in service.get("command", [])] + [str(v) for v in (service.get("environment") or {}).values()]
        named = sorted({m.group(0) for w in words for m in re.finditer(r"/pki/[\w.-]+", w)})
        if not mounts:
            if named and name != "certs":
                raise SystemExit(f"compose.yaml:{name} names {named} but mounts no certificates")
            continue
        (mount,) = mounts
        where = pki / mount["volume"]["subpath"]
        missing = [f for f in named if not (where / f.removeprefix("/pki/")).is_file()]
        if missing or not named:
            raise SystemExit(f"compose.yaml:{name}: {missing or 'no certificate'} not made by the certs script in {where.name}/")
        checked.append((name, named, where.name))
    return checked


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for name, named, subpath in compose_certificates(Path(tmp)):
            print(f"ok  compose.yaml:{name}: {', '.join(named)} made by the certs script ({subpath}/)")
    lines = command_lines()
    for where, argv, environ in lines:
        parse(argv, environ)
        settings = " ".join(f"{k}={v}" for k, v in environ.items() if k.startswith("KVPLANE_") and v != SECRET_PLACEHOLDER)
        print(f"ok  {where}: {settings + ' ' if settings else ''}kvplane {' '.join(argv)}")
    return 0 if lines else 1


if __name__ == "__main__":
    sys.exit(main())

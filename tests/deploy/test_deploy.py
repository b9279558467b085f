"""deploy/ offline: every kvplane command line parses and validates (deploy/check.py), and every
Kubernetes object is valid against the Kubernetes API schema (kubernetes-validate, strict: an
unknown field is an error)."""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.30.0"  # grpc probes need 1.27+
sys.path.insert(0, str(DEPLOY))
import check  # noqa: E402  (deploy/check.py is a script, not a package)

MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))


def test_every_kvplane_command_line_in_deploy_is_accepted():
    lines = check.command_lines()
    for _where, argv in lines:
        check.parse(argv)
    where = {w.split(":")[0] for w, _ in lines}
    assert {"k8s/sidecar-vllm.yaml", "k8s/sidecar-sglang.yaml", "k8s/workers.yaml"} <= where
    engines = {a for _, argv in lines for a in argv if a.startswith("--engine=")}
    assert engines == {"--engine=vllm", "--engine=sglang"}


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_every_kubernetes_object_is_valid(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        if doc.get("apiVersion", "").startswith("kustomize.config.k8s.io"):
            assert {Path(r).name for r in doc["resources"]} <= {p.name for p in MANIFESTS}
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_worker_containers_hold_worker_credentials_only():
    found = check.environments()
    agents = [(where, env) for where, command, env in found if command == "agent"]
    assert len(agents) == 6 and all(env.get("KVPLANE_JOIN_TOKEN") for _, env in agents)
    check.check_worker_credentials(found)
    # The control planes do hold it: they check it.
    assert any("KVPLANE_ADMIN_TOKEN" in env for _, command, env in found if command == "controlplane")
    for leak in ({"KVPLANE_TOKEN": "secret:kvplane-tokens/admin"}, {"KVPLANE_TOKEN": "${KVPLANE_ADMIN_TOKEN}"}):
        with pytest.raises(ValueError, match="an agent is given the admin token"):
            check.check_worker_credentials([("k8s/x.yaml:w/agent", "agent", {**agents[0][1], **leak})])


def test_the_check_can_fail():
    bad = yaml.safe_load((DEPLOY / "k8s" / "sidecar-vllm.yaml").read_text())
    bad["spec"]["template"]["spec"]["containers"][1]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    with pytest.raises(ValueError, match="kv_events_endpoint must be a ZMQ address"):
        check.parse(["agent", "--engine", "vllm", "--kv-events-endpoint", "localhost:5557"])

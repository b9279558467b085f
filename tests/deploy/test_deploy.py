"""deploy/ offline: every kustomize overlay renders (kubectl's built-in kustomize; `make kubectl`
installs it), every kvplane command line in it parses and validates with the container's
environment applied (deploy/check.py), and every Kubernetes object is valid against the API schema
(kubernetes-validate, strict: an unknown field is an error). Custom resources (cert-manager,
Prometheus Operator) are checked for their kind here and by promtool in test_prometheus.py."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.30.0"
sys.path.insert(0, str(DEPLOY))
import check  # noqa: E402  (deploy/check.py is a script, not a package)

pytestmark = pytest.mark.cluster  # runs kubectl
OVERLAYS = check.overlays()
CUSTOM = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate"),
          ("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}  # fmt: skip
KVPLANE_WORKLOADS = ("kvplane-controlplane", "kvplane-prefill", "kvplane-decode")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {o.name: check.render(o) for o in OVERLAYS}


def _containers(docs: list[dict], name: str) -> list[dict]:
    (doc,) = [d for d in docs if d["kind"] in check.WORKLOADS and d["metadata"]["name"] == name]
    return doc["spec"]["template"]["spec"]["containers"]


def test_the_overlays_are_there():
    assert {o.name for o in OVERLAYS} == {"dev", "production", "vllm", "sglang", "monitoring", "autoscaling", "nats", "nats-agents"}


def test_every_kvplane_command_line_in_deploy_is_accepted():
    lines = check.command_lines()
    for _where, argv, environ in lines:
        check.parse(argv, environ)
    where = {w.split(":")[0] for w, _, _ in lines}
    assert {f"k8s/overlays/{o}" for o in ("dev", "production", "vllm", "sglang", "autoscaling", "nats", "nats-agents")} <= where
    engines = {a for _, argv, _ in lines for a in argv if a.startswith("--engine=")}
    assert engines == {"--engine=vllm", "--engine=sglang"}


@pytest.mark.parametrize("overlay", [o.name for o in OVERLAYS])
def test_every_rendered_object_is_valid(rendered, overlay):
    docs = rendered[overlay]
    assert docs
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            assert doc["metadata"]["name"] and doc["spec"]
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_workers_hold_worker_credentials_only(rendered):
    for overlay, docs in rendered.items():
        for name in ("kvplane-prefill", "kvplane-decode"):
            if overlay == "monitoring":
                continue
            env = [e for c in _containers(docs, name) for e in c.get("env", [])]
            secrets = {e["valueFrom"]["secretKeyRef"]["key"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
            assert secrets <= {"join"}, (overlay, name, secrets)
            assert not any(e["name"] in ("KVPLANE_ADMIN_TOKEN", "KVPLANE_TOKEN") for e in env)
            for c in _containers(docs, name):
                assert "preStop" not in c.get("lifecycle", {}) or c["name"] == "engine"  # no `kvplane drain` (an admin call)


def test_production_runs_mutual_tls_ha_and_restricted(rendered):
    for overlay in ("production", "vllm", "sglang", "autoscaling", "nats"):
        docs = rendered[overlay]
        by_kind = {}
        for d in docs:
            by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
        cp = by_kind["Deployment"]["kvplane-controlplane"]
        assert cp["spec"]["replicas"] >= 2
        assert cp["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        pdb = by_kind["PodDisruptionBudget"]["kvplane-controlplane"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= cp["spec"]["template"]["metadata"]["labels"].items()
        assert {"kvplane-workers", "kvplane-etcd"} <= set(by_kind["NetworkPolicy"])
        assert "--client-cert-auth" in _containers(docs, "kvplane-etcd")[0]["args"]
        for name in KVPLANE_WORKLOADS:
            for c in _containers(docs, name):
                if not c["image"].startswith("kvplane"):
                    continue
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                assert {"KVPLANE_TLS_CERT", "KVPLANE_TLS_KEY", "KVPLANE_TLS_CA"} <= env.keys() and "KVPLANE_INSECURE" not in env
                assert "--insecure" not in c["args"]
                sc = c["securityContext"]
                assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        (tls,) = [v for v in by_kind["StatefulSet"]["kvplane-decode"]["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
        attributes = tls["csi"]["volumeAttributes"]
        assert attributes["csi.cert-manager.io/uri-sans"] == "spiffe://kvplane/worker/${POD_NAME}"
        # The name peers verify (identity.server_name(): NAME.worker.kvplane), and the one they dial.
        assert attributes["csi.cert-manager.io/dns-names"] == "${POD_NAME}.worker.kvplane,${POD_NAME}.kvplane-workers.${POD_NAMESPACE}.svc"
        service = by_kind["Service"]["kvplane-controlplane"]
        assert {p["name"] for p in service["spec"]["ports"]} == {"grpc", "http"}
        assert any(a == "--http-port=8080" for a in _containers(docs, "kvplane-controlplane")[0]["args"])


def test_agents_advertise_the_name_their_headless_service_gives_them(rendered):
    docs = rendered["production"]
    (workers,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "kvplane-workers"]
    assert workers["spec"]["clusterIP"] == "None" and workers["spec"]["publishNotReadyAddresses"]
    for name in ("kvplane-prefill", "kvplane-decode"):
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name]
        assert sts["spec"]["serviceName"] == "kvplane-workers"
        assert sts["spec"]["template"]["metadata"]["labels"].items() >= workers["spec"]["selector"].items()
        agent = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
        assert "--advertise-host=$(POD_NAME).kvplane-workers.$(POD_NAMESPACE).svc" in agent["args"]


def test_kustomize_v2_and_todays_render_the_same():
    """$KVPLANE_TEST_KUBECTLS: more kubectl binaries (e.g. Debian's 1.20, kustomize v2) to compare."""
    binaries = [b for b in [shutil.which("kubectl"), *filter(None, os.environ.get("KVPLANE_TEST_KUBECTLS", "").split(":"))] if b]
    if len(binaries) < 2:
        pytest.skip("one kubectl only; set KVPLANE_TEST_KUBECTLS=/path/to/kubectl-1.20 to compare")
    for overlay in OVERLAYS:
        outputs = [sorted(yaml.safe_dump(d, sort_keys=True) for d in check.render(overlay, b)) for b in binaries]
        assert all(o == outputs[0] for o in outputs), overlay.name


def test_the_check_can_fail(rendered):
    bad = _containers(rendered["dev"], "kvplane-decode")[0]
    doc = next(d for d in rendered["dev"] if d["metadata"]["name"] == "kvplane-decode")
    bad["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    with pytest.raises(ValueError, match="kv_events_endpoint must be a ZMQ address"):
        check.parse(["agent", "--engine", "vllm", "--kv-events-endpoint", "localhost:5557"])
    with pytest.raises(ValueError, match="KVPLANE_BLOCK_SIZE"):
        check.parse(["controlplane"], {"KVPLANE_BLOCK_SIZE": "many"})


def test_compose_runs_mutual_tls_with_the_certificates_its_certs_service_makes(tmp_path):
    compose = (check.DEPLOY / "compose.yaml").read_text()
    assert "--insecure" not in compose and "KVPLANE_INSECURE" not in compose
    checked = check.compose_certificates(tmp_path)  # runs the certs script with the real `kvplane certs`
    assert [name for name, _, _ in checked] == ["controlplane-a", "controlplane-b", "prefill", "decode"]
    pki = tmp_path / "pki"
    # The host's client identity, and each directory without the CA's key.
    assert sorted(p.name for p in (pki / "client").iterdir()) == ["app.web.key", "app.web.pem", "ca.pem"]
    assert not [p for d in ("controlplane", "prefill-0", "decode-0", "client") for p in (pki / d).iterdir() if p.name == "ca.key"]


def test_the_nats_overlay_puts_the_bus_behind_tls_and_the_control_plane_only(rendered):
    docs = rendered["nats"]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    env = {e["name"]: e.get("value") for e in _containers(docs, "kvplane-controlplane")[0]["env"]}
    assert env["KVPLANE_BUS"].startswith("tls://kvplane-nats.") and env["KVPLANE_BUS_STREAM_REPLICAS"] == "3"
    assert {"KVPLANE_BUS_CA", "KVPLANE_BUS_CERT", "KVPLANE_BUS_KEY"} <= env.keys()
    (nats,) = _containers(docs, "kvplane-nats")
    assert {"--config=/etc/nats/config/nats.conf", "--store_dir=/data", "--name=$(POD_NAME)"} <= set(nats["args"])
    assert by_kind["StatefulSet"]["kvplane-nats"]["spec"]["replicas"] == 3
    policy = by_kind["NetworkPolicy"]["kvplane-nats"]["spec"]
    client = [rule for rule in policy["ingress"] if {"port": "client", "protocol": "TCP"} in rule.get("ports", [])]
    assert [r["from"] for r in client] == [
        [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kvplane", "app.kubernetes.io/component": "controlplane"}}}]
    ]
    cert = by_kind["Certificate"]["kvplane-nats-server"]["spec"]
    assert cert["issuerRef"]["name"] == "kvplane-ca" and "kvplane-nats.kvplane.svc" in cert["dnsNames"]
    # Certificates map to users (tests/security/test_bus_tls.py runs this file): the only client
    # user is the control plane's certificate, the only route user a name of the NATS certificate.
    (volume,) = [v for v in by_kind["StatefulSet"]["kvplane-nats"]["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    conf = by_kind["ConfigMap"][volume["configMap"]["name"]]["data"]["nats.conf"]
    assert conf.count("verify_and_map: true") == 2 and "verify:" not in conf
    users = re.findall(r'\{user: "([^"]+)"(\}|, permissions)', conf)
    assert users == [(by_kind["Certificate"]["kvplane-controlplane"]["spec"]["uris"][0], "}"), (WORKERS_SUBJECT, ", permissions")]
    # Workers' certificates here carry no subject: the workers' user admits none of them.
    for name in ("kvplane-prefill", "kvplane-decode"):
        assert "csi.cert-manager.io/common-name" not in _csi_attributes(docs, name)
    (route_user,) = re.findall(r'authorization \{\s*user: "([^"]+)"\s*\}', conf)
    assert route_user in cert["dnsNames"] and "client auth" in cert["usages"]  # a node dials its peers with it
    for host in re.findall(r'"nats://([^:"]+):6222"', conf):  # each route's host is a name of the certificate
        assert any(host == name or (name.startswith("*.") and host.split(".", 1)[1] == name[2:]) for name in cert["dnsNames"]), host


WORKERS_SUBJECT = "CN=kvplane-worker,O=worker"


def _csi_attributes(docs: list[dict], name: str) -> dict[str, str]:
    (doc,) = [d for d in docs if d["kind"] in check.WORKLOADS and d["metadata"]["name"] == name]
    (volume,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    return volume["csi"]["volumeAttributes"]


def test_the_nats_agents_overlay_admits_the_workers_to_the_bus_by_their_subject_only(rendered):
    """nats-agents: the replicas hand agents the bus (--bus-for-agents), each worker's certificate
    keeps its own URI SAN and gains the subject nats.conf maps to the workers' user (what that
    user may do: tests/security/test_bus_tls.py), and workers may reach NATS's client port."""
    docs = rendered["nats-agents"]
    env = {e["name"]: e.get("value") for e in _containers(docs, "kvplane-controlplane")[0]["env"]}
    assert env["KVPLANE_BUS_FOR_AGENTS"] == env["KVPLANE_BUS"]  # the agents reach the same NATS by the same name
    for name in ("kvplane-prefill", "kvplane-decode"):
        attributes = _csi_attributes(docs, name)
        assert (attributes["csi.cert-manager.io/common-name"], attributes["csi.cert-manager.io/organizations"]) == (
            "kvplane-worker",
            "worker",
        )
        assert attributes["csi.cert-manager.io/uri-sans"] == "spiffe://kvplane/worker/${POD_NAME}"
        assert WORKERS_SUBJECT == f"CN={attributes['csi.cert-manager.io/common-name']},O={attributes['csi.cert-manager.io/organizations']}"
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "kvplane-nats"]
    client = [rule for rule in policy["spec"]["ingress"] if {"port": "client", "protocol": "TCP"} in rule.get("ports", [])]
    assert [p["podSelector"]["matchLabels"] for rule in client for p in rule["from"]] == [
        {"app.kubernetes.io/name": "kvplane", "app.kubernetes.io/component": "controlplane"},
        {"app.kubernetes.io/name": "kvplane", "app.kubernetes.io/part-of": "kvplane-workers"},
    ]
    assert any({"port": "cluster", "protocol": "TCP"} in rule.get("ports", []) for rule in policy["spec"]["ingress"])

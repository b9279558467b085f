"""`kvplane agent --count N`: several agents in one process, each its own worker (dataplane/agent/host.py)."""

from __future__ import annotations

import argparse

import pytest

from kvplane.apps.cluster import LocalCluster
from kvplane.dataplane.agent import host
from kvplane.dataplane.agent.main import add_arguments, agent_from_args

SIM = ("--engine", "sim", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--sim-num-blocks", "512", "--speedup", "8")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_each_agent_gets_its_own_id_port_and_certificate_files():
    args = parse(*SIM, "--count", "3", "--worker-id", "h", "--port", "41000", "--insecure")
    agents = host.agents_from_args(args, agent_from_args)
    assert [(c.worker_id, c.port) for c, _ in agents] == [("h-0", 41000), ("h-1", 41001), ("h-2", 41002)]
    assert all(not credentials.tls for _, credentials in agents)

    seen = []
    tls = parse(*SIM, "--count", "2", "--worker-id", "h", "--tls-cert", "d/{worker_id}.pem", "--tls-key", "d/{worker_id}.key",
                "--tls-ca", "d/ca.pem")  # fmt: skip
    host.agents_from_args(tls, lambda own: seen.append((own.worker_id, own.tls_cert, own.tls_key, own.port)))
    assert seen == [("h-0", "d/h-0.pem", "d/h-0.key", 0), ("h-1", "d/h-1.pem", "d/h-1.key", 0)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--tls-cert", "c.pem", "--tls-key", "c.key", "--tls-ca", "ca.pem"), "its own worker certificate"),
        (("--insecure", "--fault-injection"), "--fault-injection"),
        (("--insecure", "--port", "65535"), "past port 65535"),
    ],
)
def test_what_several_agents_in_one_process_cannot_share_is_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        host.agents_from_args(parse(*SIM, "--count", "2", *argv), agent_from_args)


@pytest.mark.cluster
def test_three_agents_in_one_process_register_and_each_serves_requests_with_its_own_certificate():
    with LocalCluster(num_prefill=0, num_decode=0, num_both=1, agents_per_process=3, agent_args=(*SIM, "--metrics-port", "-1")) as cluster:
        assert cluster.hosted_workers == {"both-0": ["both-0-0", "both-0-1", "both-0-2"]}
        assert len(cluster.processes) == 2  # the control plane and one agent process
        with cluster.client(timeout=30) as client:
            workers = {w.worker_id: w for w in client.workers()}
            assert sorted(workers) == ["both-0-0", "both-0-1", "both-0-2"]
            assert len({w.endpoint for w in workers.values()}) == 3
            for serving in workers:  # each agent answers the control plane (Drain/Undrain) and runs requests alone
                for other in workers:
                    (client.undrain if other == serving else client.drain)(other)
                result = client.generate(list(range(1, 40)), max_tokens=4, ignore_eos=True)
                assert result.metrics.decode_worker == serving
                assert len(result.token_ids) == 4

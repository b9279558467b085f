"""`kvplane config`, `kvplane profile` and `generate --priority/--reject-retries` against the scripted server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cli.conftest import run_kvplane
from tests.sdk.scripted_server import ScriptedServer

pytestmark = pytest.mark.cluster  # starts processes

OBJECTIVE = "objectives.builtin-tiny.interactive.ttft_ms"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:  # a fresh one per test: these tests change its config
    scripted = ScriptedServer().start()
    yield scripted
    scripted.stop()


def test_config_get_json_and_table(server: ScriptedServer) -> None:
    result = run_kvplane("config", "get", "--json", "--endpoint", server.endpoint)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"admission.policy": "threshold"}
    table = run_kvplane("config", "get", "--endpoint", server.endpoint).stdout.splitlines()
    assert [line.split() for line in table] == [["KEY", "VALUE"], ["admission.policy", "threshold"]]


def test_config_set_prints_the_resulting_config(server: ScriptedServer) -> None:
    result = run_kvplane("config", "set", OBJECTIVE, "250", "--endpoint", server.endpoint)
    assert result.returncode == 0, result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["KEY", "VALUE"], ["admission.policy", "threshold"], [OBJECTIVE, "250"],
    ]  # fmt: skip
    result = run_kvplane("config", "set", "admission.policy", "predictive", "--json", "--endpoint", server.endpoint)
    assert json.loads(result.stdout) == {"admission.policy": "predictive", OBJECTIVE: "250"}
    assert server.servicer.config == {"admission.policy": "predictive", OBJECTIVE: "250"}


def test_config_set_empty_value_restores_the_default(server: ScriptedServer) -> None:
    run_kvplane("config", "set", "admission.policy", "", "--endpoint", server.endpoint)
    result = run_kvplane("config", "get", "--endpoint", server.endpoint)
    assert result.stdout == "no configuration set (every key has its default)\n"


def test_config_set_unknown_key_is_one_line(server: ScriptedServer) -> None:
    result = run_kvplane("config", "set", "bogus", "1", "--endpoint", server.endpoint)
    assert result.returncode == 3  # refused as invalid
    assert result.stderr.strip() == "kvplane: error: unknown config key 'bogus'"


def test_profile_plain_and_json(server: ScriptedServer) -> None:
    result = run_kvplane("profile", "decode-0", "--max-prompt-tokens", "256", "--max-batch", "4", "--endpoint", server.endpoint)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "worker decode-0: 48 step timings, fit error 4.2% (mean absolute, relative to the step time)"
    assert [line.split() for line in lines[1:]] == [
        ["TERM", "SECONDS", "PER", "UNIT"], ["intercept_s", "0.002"], ["prefill_tokens", "1.5e-05"],
        ["prefill_attention", "1e-09"], ["decode_seqs", "0.0004"], ["decode_context_tokens", "2e-07"],
    ]  # fmt: skip
    request = server.servicer.profile_requests[-1]
    assert (request.worker_id, request.max_prompt_tokens, request.max_batch) == ("decode-0", 256, 4)
    out = json.loads(run_kvplane("profile", "prefill-0", "--json", "--endpoint", server.endpoint).stdout)
    assert out == {
        "worker_id": "prefill-0", "coefficients": [0.002, 1.5e-05, 1e-09, 0.0004, 2e-07], "num_samples": 48,
        "mean_abs_pct_error": pytest.approx(0.042),
    }  # fmt: skip


def test_profile_unknown_worker(server: ScriptedServer) -> None:
    result = run_kvplane("profile", "nope", "--endpoint", server.endpoint)
    assert (result.returncode, result.stderr.strip()) == (1, "kvplane: error: no worker 'nope'")


def test_generate_priority_and_reject_retries(server: ScriptedServer) -> None:
    result = run_kvplane("generate", "hey", "--priority", "batch", "--json", "--endpoint", server.endpoint)
    assert result.returncode == 0, result.stderr
    assert server.servicer.requests[-1].priority == "batch"
    assert json.loads(result.stdout)["predicted_ttft_ms"] == 11.0
    run_kvplane("generate", "hey", "--endpoint", server.endpoint)
    assert server.servicer.requests[-1].priority == "interactive"
    rejected = run_kvplane("generate", "reject-then-ok:1:x", "--endpoint", server.endpoint)
    assert rejected.returncode == 6 and "retry after 0.05 s" in rejected.stderr
    retried = run_kvplane("generate", "reject-then-ok:2:y", "--max-tokens", "2", "--reject-retries", "2", "--endpoint", server.endpoint)
    assert (retried.returncode, retried.stdout) == (0, "re\n")
    assert server.servicer.seen["reject-then-ok:2:y"] == 3

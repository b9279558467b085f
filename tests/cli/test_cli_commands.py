"""Client commands against the scripted Kvplane server: output shapes and error lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli.conftest import run_kvplane
from tests.sdk.scripted_server import ScriptedServer

pytestmark = pytest.mark.cluster  # starts processes

METRIC_FIELDS = {
    "prefill_worker", "decode_worker", "prompt_tokens", "cached_tokens", "kv_transfer_bytes",
    "kv_transfer_blocks", "transport", "ttft_ms", "disaggregated", "route_reason",
    "prefill_computed_tokens", "kv_transfer_ms", "request_id", "predicted_ttft_ms", "predicted_tpot_ms",
    "priority", "queued_ms", "kv_fetched_from", "kv_fetched_tokens", "num_migrations",
}  # fmt: skip


def test_generate_json_shape(server: ScriptedServer) -> None:
    result = run_kvplane("generate", "hello", "--max-tokens", "4", "--json", "--endpoint", server.endpoint)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"token_ids", "text", "finish_reason"} | METRIC_FIELDS
    assert out["token_ids"] == [104, 101, 108, 108]
    assert (out["text"], out["finish_reason"]) == ("hell", "length")
    assert (out["prefill_worker"], out["decode_worker"], out["cached_tokens"]) == ("prefill-0", "decode-0", 2)
    assert (out["kv_transfer_bytes"], out["ttft_ms"], out["disaggregated"]) == (4096, 12.5, True)


def test_generate_passes_options(server: ScriptedServer) -> None:
    result = run_kvplane(
        "generate", "hey", "--seed", "9", "--disagg", "never", "--cache-salt", "t9", "--temperature", "0.7",
        "--json", "--endpoint", server.endpoint,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    request = server.servicer.requests[-1]
    assert (request.sampling.seed, request.disagg, request.cache_salt) == (9, 2, "t9")


def test_generate_plain_streams_text_then_a_summary(server: ScriptedServer) -> None:
    result = run_kvplane("generate", "-", "--max-tokens", "3", stdin="world", env={"KVPLANE_ENDPOINT": server.endpoint})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "wor\n"
    assert result.stderr.strip() == (
        "[3 tokens, finish=length; prefill prefill-0 -> decode decode-0; prompt 5 tokens, 2 cached, "
        "KV 4.0 KiB in 1 blocks via grpc; TTFT 12.5 ms]"
    )


def test_generate_rejection_is_one_line_with_retry_hint(server: ScriptedServer) -> None:
    result = run_kvplane("generate", "reject", "--endpoint", server.endpoint)
    assert result.returncode == 6  # rejected by admission
    assert result.stderr.strip() == (
        "kvplane: error: request rejected: no decode worker can meet the TTFT objective [ttft_slo]; retry after 1.5 s"
    )


def test_route(server: ScriptedServer) -> None:
    result = run_kvplane("route", "p", "--json", "--endpoint", server.endpoint)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["decode_worker"], out["prefill_worker"], out["cached_tokens"]) == ("decode-0", "prefill-0", 16)
    assert out["candidates"] == [{"worker_id": "decode-0", "cost": 1.5, "cached_tokens": 16, "admissible": True, "note": "best"}]
    plain = run_kvplane("route", "p", "--endpoint", server.endpoint)
    assert "decode worker:  decode-0" in plain.stdout and "  decode-0: cost 1.5, 16 cached tokens, ok\n" in plain.stdout
    explained = run_kvplane("route", "p", "--explain", "--endpoint", server.endpoint)
    assert "  decode-0: cost 1.5, 16 cached tokens, ok\n      best\n" in explained.stdout


def test_workers_json_and_table(server: ScriptedServer) -> None:
    result = run_kvplane("workers", "--json", "--endpoint", server.endpoint)
    assert result.returncode == 0, result.stderr
    prefill, decode = json.loads(result.stdout)
    assert {k: prefill[k] for k in ("id", "role", "endpoint", "state", "model")} == {
        "id": "prefill-0", "role": "prefill", "endpoint": "127.0.0.1:7001", "state": "active", "model": "builtin-tiny",
    }  # fmt: skip
    assert prefill["load"]["num_running"] == 1 and prefill["load"]["num_total_blocks"] == 512
    assert (decode["role"], decode["state"], decode["layout"]) == ("decode", "draining", None)
    assert (prefill["out_of_routing"], decode["out_of_routing"]) == ("", "stalled a request 3.0 s ago")
    table = run_kvplane("workers", "--endpoint", server.endpoint).stdout.splitlines()
    header = ["ID", "ROLE", "STATE", "ENDPOINT", "MODEL", "RUNNING", "WAITING", "BLOCKS", "LOAD", "AGE", "OUT", "OF", "ROUTING"]
    assert table[0].split() == header
    assert table[1].split() == ["prefill-0", "prefill", "active", "127.0.0.1:7001", "builtin-tiny", "1", "2", "10/512", "0.2s", "-"]
    assert table[2].endswith("stalled a request 3.0 s ago")


def test_cache_json_and_table(server: ScriptedServer) -> None:
    out = json.loads(run_kvplane("cache", "--json", "--endpoint", server.endpoint).stdout)
    assert out == [{"id": "decode-0", "blocks_by_tier": {"device": 7, "host": 3}, "pinned_blocks": 2}]
    table = run_kvplane("cache", "--endpoint", server.endpoint).stdout.splitlines()
    assert [line.split() for line in table] == [
        ["WORKER", "DEVICE", "HOST", "DISK", "TOTAL", "PINNED"],
        ["decode-0", "7", "3", "0", "10", "2"],
    ]


def test_drain(server: ScriptedServer) -> None:
    result = run_kvplane("drain", "decode-0", "--endpoint", server.endpoint)
    assert (result.returncode, result.stdout) == (0, "worker decode-0 is draining\n")
    assert json.loads(run_kvplane("drain", "decode-0", "--json", "--endpoint", server.endpoint).stdout) == {
        "id": "decode-0", "state": "draining",
    }  # fmt: skip
    missing = run_kvplane("drain", "nope", "--endpoint", server.endpoint)
    assert missing.returncode == 1 and missing.stderr.strip() == "kvplane: error: no worker 'nope'"


def test_client_commands_do_not_import_torch(server: ScriptedServer) -> None:
    # Client commands must start fast; the server modules (and torch) load only for server commands.
    code = (
        "import sys; from kvplane.apps.cli.main import main; "
        f"rc = main(['workers', '--json', '--endpoint', '{server.endpoint}']); "
        "assert 'torch' not in sys.modules and 'kvplane.controlplane' not in sys.modules, 'heavy import'; sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_wait_returns_once_enough_workers_are_active(server: ScriptedServer) -> None:
    result = run_kvplane("wait", "--workers", "1", "--within", "10", "--endpoint", server.endpoint)
    assert (result.returncode, result.stderr) == (0, "")
    # The scripted server lists one active and one draining worker: asking for two waits, then exits "unavailable".
    result = run_kvplane("wait", "--workers", "2", "--within", "0.5", "--endpoint", server.endpoint)
    assert result.returncode == 5
    assert result.stderr.strip() == "kvplane: error: not ready after 0.5 s: 1 of 2 workers active"


def test_top_ends_on_ctrl_c_after_the_grpc_call_in_flight() -> None:
    """SIGINT while `kvplane top` waits for ListWorkers: the call is answered (not cancelled by a
    KeyboardInterrupt inside gRPC, whose channel close can then hang: grpc/grpc#19973), no refresh
    follows, and top exits 130 as a Ctrl-C does."""
    import os
    import signal
    import time

    from tests.cli.conftest import REPO_ROOT

    scripted = ScriptedServer().start()
    scripted.servicer.list_workers_delay_s = 1.0
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    top = subprocess.Popen([sys.executable, "-m", "kvplane", "top", "--interval", "0.1", "--endpoint", scripted.endpoint],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)  # fmt: skip
    try:
        shown = ""
        for row in iter(top.stdout.readline, ""):  # the first refresh
            shown += row
            if "DEVICE/HOST/DISK" in row:
                break
        deadline = time.monotonic() + 30
        while scripted.servicer.list_workers_started < 2 and time.monotonic() < deadline:  # the second refresh's call
            time.sleep(0.02)
        assert scripted.servicer.list_workers_started == 2, shown
        top.send_signal(signal.SIGINT)
        rest, err = top.communicate(timeout=30)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        scripted.stop()
    assert top.returncode == 130 and "kvplane: interrupted" in err, (top.returncode, err)
    assert scripted.servicer.list_workers_answered == 2  # the call in flight ended as a call, not cancelled
    assert "DEVICE/HOST/DISK" not in rest  # and no refresh after the interrupt

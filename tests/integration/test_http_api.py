"""The OpenAI-compatible HTTP API against a real local cluster, driven by the official `openai`
package (and curl, as the README shows it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from kvplane import Client, RejectedError
from kvplane.apps.cluster import LocalCluster
from tests.engine.helpers import write_hf_llama

from .helpers import BLOCK_SIZE, https_context, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes

README = Path(__file__).resolve().parents[2] / "README.md"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two `both` workers of the builtin byte model (no chat template), HTTP API on."""
    log_dir = tmp_path_factory.mktemp("http-logs")
    with LocalCluster(num_prefill=0, num_decode=0, num_both=2, http_port=0, log_dir=log_dir) as c:
        yield c


@pytest.fixture(scope="module")
def api(cluster):
    https = httpx.Client(verify=https_context(cluster), timeout=120)  # the cluster's CA: the HTTP API serves HTTPS
    with openai.OpenAI(base_url=cluster.http_url, api_key=cluster.http_token, max_retries=0, timeout=120, http_client=https) as client:
        yield client


def test_completion_streamed_and_not_give_the_same_greedy_text_and_usage(api):
    prompt = "The observatory dome opens when"
    full = api.completions.create(model="builtin-tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert full.object == "text_completion" and len(full.choices) == 1
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 12
    assert full.usage.prompt_tokens == len(prompt.encode()) and full.usage.total_tokens == full.usage.prompt_tokens + 12
    chunks = list(api.completions.create(model="builtin-tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_token_id_prompts_and_a_repeated_prefix_report_cached_tokens(api, cluster):
    prefix = prompt_ids(seed=3, length=8 * BLOCK_SIZE)
    first = api.completions.with_raw_response.create(model="builtin-tiny", prompt=prefix + [1, 2], max_tokens=2)
    holder = first.headers["x-kvplane-decode-worker"]
    # As the same tenant as the HTTP token: another tenant's route would see no cached tokens.
    with Client(cluster.endpoint, token=cluster.http_token) as client:
        wait_for(lambda: client.route(prefix + [3, 4], max_tokens=2).cached_tokens > 0, timeout=10, what="the prefix in the index")
    second = api.completions.with_raw_response.create(model="builtin-tiny", prompt=prefix + [3, 4], max_tokens=2)
    body = second.parse()
    assert second.headers["x-kvplane-decode-worker"] == holder
    assert body.usage.prompt_tokens_details.cached_tokens == 8 * BLOCK_SIZE
    assert int(second.headers["x-kvplane-cached-tokens"]) == 8 * BLOCK_SIZE
    assert second.headers["x-kvplane-request-id"]


def test_stop_strings_end_the_answer_before_them(api):
    full = api.completions.create(model="builtin-tiny", prompt="abc", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = text[4:6]
    assert stop, f"need a longer answer to cut: {text!r}"
    cut = api.completions.create(
        model="builtin-tiny", prompt="abc", max_tokens=16, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_bad_input_is_a_400_and_an_unknown_model_a_404(api):
    with pytest.raises(openai.BadRequestError, match="n"):
        api.completions.create(model="builtin-tiny", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        api.completions.create(model="builtin-tiny", prompt="x", temperature=5)
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        api.completions.create(model="builtin-tiny", prompt=[100000], max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="no chat template"):  # the builtin model has none
        api.chat.completions.create(model="builtin-tiny", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-9'"):
        api.completions.create(model="gpt-9", prompt="x")


def test_models_health_and_metrics(api, cluster):
    assert [m.id for m in api.models.list()] == ["builtin-tiny"]
    base = cluster.http_url.removesuffix("/v1")
    assert httpx.get(f"{base}/health", verify=https_context(cluster)).json() == {"status": "ok", "workers": 2}
    samples = scrape(f"{base}/metrics", cluster.http_ca)
    assert any(k.startswith("kvplane_http_requests_total") and 'http_route="/v1/completions"' in k for k in samples)


def test_calls_without_a_known_token_are_refused(cluster):
    body = {"model": "builtin-tiny", "prompt": "hello", "max_tokens": 2}
    ca = https_context(cluster)
    # No token: refused on the headers (401), before the body is read (issue 28).
    anonymous = httpx.post(f"{cluster.http_url}/completions", json=body, timeout=30, verify=ca)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "authentication_error"
    response = httpx.post(
        f"{cluster.http_url}/completions", json=body, timeout=30, headers={"authorization": "Bearer not-a-token-we-know"}, verify=ca
    )
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{cluster.http_url}/models", timeout=30, verify=ca).status_code == 200  # listing models needs no token
    with pytest.raises(httpx.ConnectError):  # HTTPS only: and a client that does not trust the cluster CA refuses it
        httpx.get(f"{cluster.http_url}/models", timeout=30)


def test_a_rejection_is_a_429_with_retry_after(cluster):
    with Client(cluster.endpoint, timeout=120) as client:
        client.profile("both-0")
        client.profile("both-1")
        client.set_config("objectives.*.interactive.ttft_ms", "0.001")
        client.set_config("admission.policy", "predictive")
        try:
            # The profiles reach the planner with each worker's next load report: until then a
            # worker has no latency model and predictive admission takes the request.
            def predicted_everywhere() -> bool:
                try:
                    return not any(c.admissible for c in client.route("hello", max_tokens=4).candidates)
                except RejectedError:  # Route runs admission too
                    return True

            wait_for(predicted_everywhere, timeout=30, what="both workers' latency models in the control plane")
            response = httpx.post(
                f"{cluster.http_url}/completions",
                json={"model": "builtin-tiny", "prompt": "hello", "max_tokens": 4},
                timeout=60,
                headers={"authorization": f"Bearer {cluster.http_token}"},
                verify=https_context(cluster),
            )
        finally:
            client.set_config("admission.policy", "")
            client.set_config("objectives.*.interactive.ttft_ms", "")
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "objective=ttft" in error["message"]


def test_a_client_that_disconnects_mid_stream_aborts_its_request(cluster):
    with Client(cluster.endpoint) as client:
        wait_for(lambda: all(w.load.num_running == 0 for w in client.workers()), timeout=30, what="idle workers")
        body = {"model": "builtin-tiny", "prompt": prompt_ids(seed=5, length=40), "max_tokens": 1000, "stream": True, "ignore_eos": True}
        auth = {"authorization": f"Bearer {cluster.http_token}"}
        with httpx.stream(
            "POST", f"{cluster.http_url}/completions", json=body, timeout=60, headers=auth, verify=https_context(cluster)
        ) as response:
            assert response.status_code == 200, response.read()
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            wait_for(lambda: sum(w.load.num_running for w in client.workers()) == 1, timeout=10, what="the request running")
        # The connection is closed after one chunk of 1,000 tokens: the engine drops the request.
        wait_for(
            lambda: all(w.load.num_running == 0 and w.load.num_waiting == 0 and w.load.num_used_blocks == 0 for w in client.workers()),
            timeout=10, what="the request aborted and its blocks released",
        )  # fmt: skip


def test_chat_completions_use_the_models_chat_template(tmp_path):
    checkpoint = write_hf_llama(tmp_path / "chat-llama")
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, agent_args=("--model", str(checkpoint)), http_port=0, log_dir=tmp_path / "logs"
    ) as c:
        https = httpx.Client(verify=https_context(c), timeout=120)
        with openai.OpenAI(base_url=c.http_url, api_key=c.http_token, max_retries=0, timeout=120, http_client=https) as api:
            messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}]
            full = api.chat.completions.create(
                model="chat-llama", messages=messages, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
            )
            chunks = list(api.chat.completions.create(model="chat-llama", messages=messages, max_tokens=6, temperature=0, stream=True,
                                                      stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))  # fmt: skip
        with Client(c.endpoint) as client:
            rendered = "<s><|system|>be brief</s><|user|>the quick brown fox</s><|assistant|>"
            from tokenizers import Tokenizer

            expected_ids = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(rendered, add_special_tokens=False).ids
            plain = client.generate(expected_ids, max_tokens=6, temperature=0, ignore_eos=True)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    assert full.usage.prompt_tokens == len(expected_ids)
    assert full.choices[0].message.content == plain.text  # the template's tokens, then the same greedy answer
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == plain.text
    assert chunks[-1].usage.completion_tokens == 6


def test_the_readme_curl_example_runs(cluster):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    # The command: from `curl` to the first line that does not continue with a backslash.
    block = re.search(r"^curl [^\n]*/v1/completions(?:[^\n]*\\\n)*[^\n]*$", README.read_text(), re.M)
    assert block, "README has no curl example for /v1/completions"
    command = block.group(0).replace("https://127.0.0.1:8000/v1", cluster.http_url)
    env = dict(os.environ, TOKEN=cluster.http_token, CA=cluster.http_ca)  # what `kvplane up` prints
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=True, env=env)
    answer = json.loads(result.stdout)
    assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] > 0

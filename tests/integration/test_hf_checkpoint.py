"""A cluster serving a local Hugging Face checkpoint (written by the test): text in, text out,
disaggregated, with the tokenizer from the checkpoint's tokenizer.json. The control plane
tokenizes the prompt and detokenizes the relayed answer; in lookaside mode the decode agent makes
the text (its engine's tokenizer): the two agree."""

from __future__ import annotations

import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster
from tests.engine.helpers import load_hf, write_hf_llama

pytestmark = pytest.mark.cluster  # starts processes


def test_cluster_serves_a_local_hf_checkpoint(tmp_path):
    import torch

    checkpoint = write_hf_llama(tmp_path / "tiny-llama")
    text = "the quick brown fox jumps over the lazy dog " * 3
    with LocalCluster(num_prefill=1, num_decode=1, agent_args=("--model", str(checkpoint)), log_dir=tmp_path / "logs") as cluster:
        with Client(cluster.endpoint, timeout=60) as client:
            assert {w.model for w in client.workers()} == {"tiny-llama"}
            result = client.generate(text, max_tokens=8, disagg="always", ignore_eos=True)
            streamed = list(client.stream(text, max_tokens=8, ignore_eos=True))  # one message per token
            placed = client.generate(text, max_tokens=8, ignore_eos=True, lookaside=True)
    assert result.metrics.disaggregated and result.metrics.kv_transfer_blocks >= 1
    # The same greedy tokens as transformers on the same checkpoint and prompt ids.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    prompt = tokenizer.encode(text, add_special_tokens=False).ids
    hf = load_hf(checkpoint)
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, len(prompt) :].tolist()
    assert list(result.token_ids) == expected
    assert result.text == tokenizer.decode(expected, skip_special_tokens=True) != ""
    assert "".join(c.text for c in streamed) == result.text and [t for c in streamed for t in c.token_ids] == expected
    assert placed.token_ids == result.token_ids and placed.text == result.text

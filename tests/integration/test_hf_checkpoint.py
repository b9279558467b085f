"""A cluster serving a local Hugging Face checkpoint (written by the test): text in, text out,
disaggregated, with the tokenizer from the checkpoint's tokenizer.json."""

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
    assert result.metrics.disaggregated and result.metrics.kv_transfer_blocks >= 1
    # The same greedy tokens as transformers on the same checkpoint and prompt ids.
    from tokenizers import Tokenizer

    prompt = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    hf = load_hf(checkpoint)
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, len(prompt) :].tolist()
    assert list(result.token_ids) == expected
    assert isinstance(result.text, str) and result.text

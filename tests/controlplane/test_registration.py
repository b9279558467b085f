"""A registering worker must fit the cluster: its model and its KV block size (named in the refusal)."""

from __future__ import annotations

from kvplane.controlplane.registration import mismatch
from kvplane.v1 import common_pb2


def worker(worker_id: str, model: str = "tiny", block_size: int = 32) -> common_pb2.WorkerInfo:
    return common_pb2.WorkerInfo(worker_id=worker_id, model=model, layout=common_pb2.KVLayout(block_size=block_size, num_layers=2))


def test_a_worker_that_fits_is_accepted():
    assert mismatch(worker("a"), [worker("b")], models=("tiny",), block_size=32) is None
    assert mismatch(worker("a", model="other", block_size=16), [worker("b")]) is None  # another model may differ


def test_the_model_must_be_one_the_cluster_serves():
    problem = mismatch(worker("a", model="llama"), [], models=("tiny",))
    assert problem.startswith("model: worker a serves 'llama', but this cluster serves ['tiny']")


def test_the_block_size_must_be_the_clusters():
    problem = mismatch(worker("a", block_size=16), [], block_size=32)
    assert problem.startswith("block_size: worker a's engine uses 16-token KV blocks, but this cluster's block size is 32")


def test_without_a_cluster_block_size_workers_of_one_model_must_agree():
    problem = mismatch(worker("a", block_size=16), [worker("b", block_size=32)])
    assert problem.startswith("block_size: worker a's engine uses 16-token KV blocks, but worker b of model 'tiny' uses 32")
    # Re-registering under its own id is not a conflict with its old record.
    assert mismatch(worker("a", block_size=16), [worker("a", block_size=32)]) is None


def test_the_first_other_worker_of_the_model_answers_for_all():
    """Workers of one model share one block size (this rule): a registration reads no further."""

    def fleet():
        yield worker("other-model", model="big", block_size=16)
        yield worker("b", block_size=32)
        raise AssertionError("read past the first worker of the model")

    assert mismatch(worker("a"), fleet()) is None
    assert mismatch(worker("a", block_size=16), fleet()).startswith("block_size: worker a's engine uses 16-token KV blocks, but worker b")

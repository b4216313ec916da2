"""DTensor params and optimizer state through torch.distributed.checkpoint
(fd.distributed.save/load) on 2 gloo processes (127.0.0.1): saved with the weights
sharded by rows, loaded on 2 ranks with them sharded by columns, and in 1 process
without a process group, bitwise equal to the values saved; data-parallel fd.fit of
DTensor params checkpoints through DCP and resumes bitwise, also with another
sharding.

The job (tests/_support/dist_dcp_worker.py) runs the checks on both ranks; the tests read
each rank's report, then load its folder here.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

import functd as fd
from tests._support.dist_job import launch

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "_support" / "dist_dcp_worker.py"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("dcp")
    return out, launch(WORKER, 2, out, timeout=240)


def _ok(job, name):
    values = []
    for r, rep in enumerate(job[1]):
        res = rep[name]
        assert res["ok"], f"rank {r}: {res['type']}: {res['message']}\n{res['traceback']}"
        values.append(res["value"])
    return values


def test_saved_sharded_by_rows(job):
    v = _ok(job, "save_sharded")
    assert [x["local_weight_shape"] for x in v] == [[4, 4], [4, 4]]  # 8 rows over 2 ranks


def test_loaded_on_two_ranks_sharded_by_columns_bitwise(job):
    v = _ok(job, "load_resharded_on_two_ranks")
    assert all(x["leaves"] == 4 + 1 + 4 + 4 for x in v)  # params, count, two moments
    assert [x["local_weight_shape"] for x in v] == [[8, 2], [8, 2]]  # 4 columns over 2


def test_loaded_whole_on_every_rank(job):
    assert _ok(job, "load_whole_on_every_rank") == [13, 13]


def test_loaded_in_one_process_without_a_group(job):
    out = job[0]
    _ok(job, "save_sharded")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DCP's "single process" warning is expected here
        back = fd.distributed.load(out / "ckpt")
    expected = fd.load(out / "full.pt")
    assert isinstance(back["params"], fd.TensorDict)
    for x, y in zip(fd.tree.leaves(back), fd.tree.leaves(expected), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)
    like = {"params": expected["params"].apply(torch.zeros_like)}
    placed = fd.distributed.load(out / "ckpt", like=like)
    fd.testing.assert_close(placed["params"], expected["params"], rtol=0, atol=0)
    assert float(like["params"]["0", "weight"].abs().sum()) == 0  # like is never written


def test_fit_resumes_from_dcp_bitwise_and_with_another_sharding(job):
    v = _ok(job, "fit_resumes_from_dcp")
    assert [x["leaves"] for x in v] == [14, 14]  # params, Adam's state, history: bitwise
    assert v[0]["files"] == ["ckpt", "ckpt.1"]  # two folders kept, nothing left over
    assert [x["resharded_leaves"] for x in v] == [14, 14]  # resumed sharded by columns


def test_load_errors_name_the_problem(job, tmp_path):
    out = job[0]
    _ok(job, "save_sharded")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint there"):
        fd.distributed.load(tmp_path)
    bad = {"params": fd.TensorDict({"0": {"weight": torch.zeros(3, 3)}})}
    with pytest.raises(ValueError, match=r"at 'params.0.weight'.*torch.float64 \[8, 4\].*\[3, 3\]"):
        fd.distributed.load(out / "ckpt", like={"params": bad["params"].double()})
    with pytest.raises(ValueError, match=r"`like` has the key path 'params.nope'"):
        fd.distributed.load(out / "ckpt", like={"params": {"nope": torch.zeros(1)}})


def test_one_process_round_trip(tmp_path):
    tree = {
        "params": fd.TensorDict({"w": torch.randn(3, 2), "b": {"x": torch.arange(3)}}, [3]),
        "meta": [None, 3, "s"],
    }
    fd.distributed.save(tree, tmp_path / "c")
    fd.distributed.save(tree, tmp_path / "c")  # replaces it
    assert sorted(os.listdir(tmp_path)) == ["c"]
    back = fd.distributed.load(tmp_path / "c")
    fd.testing.assert_close(back["params"], tree["params"])
    assert back["params"].batch_size == torch.Size([3]) and back["meta"] == [None, 3, "s"]


DCP_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


@pytest.mark.parametrize("dtype", DCP_DTYPES, ids=str)
def test_every_dtype_round_trips_bitwise_through_dcp(tmp_path, dtype):
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (6 * size,), dtype=torch.uint8)
    x = (raw % 2 if dtype is torch.bool else raw).view(dtype).reshape(2, 3)  # NaN payloads too
    tree = {"td": fd.TensorDict({"x": x, "y": x[:, :1]}, [2])}
    fd.distributed.save(tree, tmp_path / "c")
    for back in (
        fd.distributed.load(tmp_path / "c"),
        fd.distributed.load(tmp_path / "c", like=tree),
    ):
        for k in ("x", "y"):
            got, want = back["td"][k], tree["td"][k]
            assert got.dtype == dtype and torch.equal(
                got.view(torch.uint8), want.contiguous().view(torch.uint8)
            )

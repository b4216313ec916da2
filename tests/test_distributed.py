"""functd.distributed on 2 gloo processes (127.0.0.1), started once for the module.

The job (tests/_support/dist_worker.py) runs every check on both ranks and reports
each outcome; the tests below read the report. References: torch DDP with
torch.optim.Adam, and the same training in one process on the full batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import functd as fd
from tests._support.dist_job import launch

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "_support" / "dist_worker.py"
WORLD = 2


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    return launch(WORKER, WORLD, out)


def _ok(report, name):
    for r, rep in enumerate(report):
        res = rep[name]
        assert res["ok"], f"rank {r}: {res['type']}: {res['message']}\n{res['traceback']}"
    return [rep[name].get("value") for rep in report]


def test_all_reduce_ops_buckets_and_purity(report):
    _ok(report, "all_reduce_ops")


def test_broadcast_all_gather_reduce_scatter(report):
    _ok(report, "broadcast_all_gather_reduce_scatter")


def test_laws_on_random_trees(report):
    _ok(report, "laws_on_random_trees")


def test_pmean_adam_equals_ddp_and_single_process(report):
    _ok(report, "pmean_adam_equals_ddp_and_single_process")


def test_pmean_hot_path_equals_all_reduce_and_checks_new_layouts(report):
    for msg in _ok(report, "pmean_hot_path_equals_all_reduce"):
        assert "at the key 'w'" in msg and "float64[2, 7]" in msg and "float64[2, 8]" in msg


def test_clip_after_pmean_sees_the_global_norm(report):
    _ok(report, "clip_after_pmean_sees_global_norm")


def test_fit_data_parallel_equals_single_process(report):
    _ok(report, "fit_data_parallel_equals_single_process")


def test_pmean_resolves_partial_dtensor_grads(report):
    _ok(report, "pmean_resolves_partial_dtensor_grads")


@pytest.mark.compile
def test_compiled_step_with_pmean_and_collectives_equal_eager(report):
    _ok(report, "compiled_step_and_collectives_equal_eager")


def test_different_keys_across_ranks_is_an_error_on_every_rank(report):
    for msg in _ok(report, "bad_different_keys"):
        assert "ranks passed different trees" in msg
        assert "'b'" in msg and "rank 1" in msg


def test_different_shapes_across_ranks_names_the_key(report):
    for msg in _ok(report, "bad_different_shapes"):
        assert "at the key 'w'" in msg and "float64[2, 3]" in msg and "float64[2, 4]" in msg


def test_fit_batch_not_divisible_by_world_size(report):
    for msg in _ok(report, "bad_fit_batch_not_divisible"):
        assert "5 rows" in msg and "world size 2" in msg and "drop_last" in msg


def test_fit_data_parallel_needs_a_reducing_optimizer(report):
    for msg in _ok(report, "bad_fit_without_pmean"):
        assert "fd.distributed.mean_updates() first" in msg


def test_bad_arguments_are_clear_errors(report):
    for scatter, op, mean_int, not_tensor, src, vmapped in _ok(report, "bad_arguments"):
        assert "'w' has shape [3, 2]" in scatter and "divisible by the world size 2" in scatter
        assert "op must be one of" in op and "'avg'" in op
        assert "op='mean' needs floating-point leaves" in mean_int and "op='sum'" in mean_int
        assert "leaf at 'n' is a float, not a tensor" in not_tensor
        assert "src must be a rank in [0, 2)" in src
        assert "inside torch.func.vmap/grad" in vmapped and "after the vmap" in vmapped


# ------------------------------------------------------------------ in this process
@pytest.mark.parametrize(
    "call",
    [
        lambda t: fd.distributed.all_reduce(t),
        lambda t: fd.distributed.broadcast(t),
        lambda t: fd.distributed.all_gather(t),
        lambda t: fd.distributed.reduce_scatter(t),
        lambda t: fd.distributed.shard_batch(t),
    ],
)
def test_no_process_group_says_how_to_start_one(call):
    assert not torch.distributed.is_initialized()
    td = fd.TensorDict({"x": torch.ones(2)}, [2])
    with pytest.raises(RuntimeError, match=r"no torch.distributed process group.*torchrun"):
        call(td)


def test_pmean_without_process_group_and_fit_data_parallel_without_one():
    params = fd.TensorDict({"w": torch.ones(2)}, [])
    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.sgd(0.1))
    with pytest.raises(RuntimeError, match="init_process_group"):
        opt.update(params, opt.init(params), params)
    step = fd.train_step(lambda p, b, k: (p["w"] ** 2).sum(), opt)
    with pytest.raises(RuntimeError, match=r"fd.fit\(data_parallel=True\).*torchrun"):
        fd.fit(step, params, opt.init(params), [None], data_parallel=True)


def test_fit_checkpoint_in_one_process_is_loadable(tmp_path):
    params = fd.TensorDict({"w": torch.ones(2)}, [])
    opt = fd.optim.sgd(0.5)
    step = fd.train_step(lambda p, b, k: (p["w"] ** 2).sum(), opt)
    path = tmp_path / "ckpt.pt"
    p, s, _ = fd.fit(
        step, params, opt.init(params), [None, None], epochs=2, progress=False, checkpoint=path
    )
    saved = fd.load(path)
    fd.testing.assert_close(saved["params"], p)
    fd.testing.assert_close(saved["opt_state"], s)
    assert int(saved["epoch"]) == 2
    fd.testing.assert_close(p["w"], torch.zeros(2))  # w - 0.5 * 2w, twice


def test_pmean_is_a_stateless_value():
    assert fd.distributed.mean_updates() == fd.distributed.mean_updates()
    assert fd.distributed.mean_updates() != fd.distributed.sum_updates()
    assert repr(fd.distributed.mean_updates()).startswith("mean_updates(")
    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-3))
    params = fd.TensorDict({"w": torch.ones(2)}, [])
    assert opt.init(params)["0"].keys() == ()

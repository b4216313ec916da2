"""functd.distributed on each backend: gloo on CPU here, NCCL on CUDA when there is one.

The same worker (tests/_support/dist_backend_worker.py) runs on 2 gloo ranks on CPU, and
on NCCL with one rank per CUDA device (at most 2; one device gives a 1-rank
group, which still runs the collectives, the data-parallel step and fit on the
GPU). The gloo run keeps the worker honest on machines without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests._support.dist_job import launch

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "_support" / "dist_backend_worker.py"
NAMES = (
    "collectives",
    "pmean_adam_equals_one_process",
    "fit_data_parallel_equals_fit",
    "ranks_with_different_shapes_are_named",
)


def _run(tmp_path, backend: str, world: int) -> list[dict]:
    return launch(WORKER, world, tmp_path, backend)


def _check(reports: list[dict]) -> None:
    for r, rep in enumerate(reports):
        assert tuple(rep) == NAMES
        for name, res in rep.items():
            assert res["ok"], (
                f"rank {r}, {name}: {res['type']}: {res['message']}\n{res['traceback']}"
            )


def test_gloo_on_cpu(tmp_path):
    reports = _run(tmp_path, "gloo", 2)
    _check(reports)
    for rep in reports:  # the structure check ran with 2 ranks and named the key
        msg = rep["ranks_with_different_shapes_are_named"]["value"]
        assert "at the key 'w', rank 0 has float64[2, 3]" in msg and "float64[2, 4]" in msg


@pytest.mark.cuda  # (run by benchmarks/gpu_check.py's `pytest -m cuda`)
@pytest.mark.skipif(
    not (torch.cuda.is_available() and dist.is_nccl_available()), reason="needs CUDA and NCCL"
)
def test_nccl_on_cuda(tmp_path):
    _check(_run(tmp_path, "nccl", min(2, torch.cuda.device_count())))

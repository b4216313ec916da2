"""functd.distributed on each backend: gloo on CPU here, NCCL on CUDA when there is one.

The same worker (tests/_dist_backend_worker.py) runs on 2 gloo ranks on CPU, and
on NCCL with one rank per CUDA device (at most 2; one device gives a 1-rank
group, which still runs the collectives, the data-parallel step and fit on the
GPU). The gloo run keeps the worker honest on machines without a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.distributed
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = (
    "collectives",
    "pmean_adam_equals_one_process",
    "fit_data_parallel_equals_fit",
    "ranks_with_different_shapes_are_named",
)


def _run(tmp_path, backend: str, world: int) -> list[dict]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    worker = os.path.join(ROOT, "tests", "_dist_backend_worker.py")
    args = [str(world), str(port), str(tmp_path), backend]
    procs = [
        subprocess.Popen(
            [sys.executable, worker, str(r), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{log}"
    reports = []
    for r in range(world):
        with open(tmp_path / f"rank{r}.json") as f:
            reports.append(json.load(f))
    return reports


def _check(reports: list[dict]) -> None:
    for r, rep in enumerate(reports):
        assert tuple(rep) == NAMES
        for name, res in rep.items():
            assert res["ok"], f"rank {r}, {name}: {res['message']}\n{res['traceback']}"


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

"""`make gpu-check` must skip cleanly without CUDA and parse the benchmarks' tables."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_check.py")


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_rows_keeps_data_rows_only():
    text = "# title\n\n| a | b |\n|---|---|\n| 1 | 2.5 |\n| x | y |\n\ntargets: met\n"
    assert _load().table_rows(text) == ["1 · 2.5", "x · y"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_skips_without_cuda():
    env = {k: v for k, v in os.environ.items() if k != "GPU_CHECK_DEVICE"}
    done = subprocess.run(
        [sys.executable, PATH], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "skipped: no CUDA device" in done.stdout

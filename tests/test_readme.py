"""Every python code block of README.md runs as pasted, top to bottom, in one
namespace, on the CPU, and writes no file into the current folder."""

import importlib.util
import os
import re
import warnings
from pathlib import Path

import pytest
import torch

import functd as fd

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def test_readme_has_python_blocks():
    blocks = _blocks()
    assert len(blocks) >= 7  # the tours, transforms, randomness, training, state, CUDA graphs
    assert all(b.strip() for b in blocks)


def test_readme_code_blocks_run_in_order(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")  # "A real model" (the models extra)
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__readme__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, block in enumerate(_blocks()):
            exec(compile(block, f"README.md python block {i}", "exec"), ns)
    assert os.listdir(tmp_path) == [], "a README block wrote into the current folder"
    # the only warning is the documented fallback of fd.cuda_graph without CUDA (torch's
    # own deprecation notices, e.g. at inductor's first import, are ignored as in pytest)
    torch_dir = os.path.dirname(torch.__file__)
    caught = [
        w
        for w in caught
        if not (
            issubclass(w.category, DeprecationWarning | FutureWarning)
            and w.filename.startswith(torch_dir)
        )
    ]
    kinds = [w.category for w in caught]
    assert kinds == ([] if torch.cuda.is_available() else [fd.CudaGraphWarning]), [
        str(w.message) for w in caught
    ]
    captured = capsys.readouterr()
    out = captured.out
    assert "TensorDict is immutable" in out
    if importlib.util.find_spec("tqdm") is None:  # fit's epoch line
        assert re.search(r"epoch 5/5: loss \S+ \(1 step, ", out)
    else:  # fit's progress bar (tqdm writes to stderr)
        assert "epoch 5/5" in captured.err
    assert ns["step"].cache_info().eager >= 2  # the CUDA-graph block ran its steps

"""fd.jit's compiled artifacts: ``lower(...).compile()``, ``.save(path)``,
``fd.load_compiled(path)`` in a fresh process, and the loader's refusals.

One artifact for the whole file (AOTInductor builds it with g++): the tutorial block
followed by a tiny TensorDict step that draws from a key, takes a static scale and
returns an input passed through and constants. The reference is fd.jit's own call
(``backend="fx"``: the traced graph run as it is, no second C++ compile).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
import torch

import functd as fd
from functd.testing import assert_close
from tests._support.conformance import _tutorial_block

pytestmark = pytest.mark.compile

BLOCK = _tutorial_block()
SCALE = 2.0


def step(params, td, key, scale):
    out = BLOCK(params, td)
    noisy = out["y"] * scale + fd.random.normal(key, td["x"].shape)
    return out.set("noisy", noisy), {"x": td["x"], "n": 3, "dtype": torch.float32}


def _inputs(n=4):
    torch.manual_seed(0)
    td = fd.TensorDict({"x": torch.randn(n, 3)}, [n])
    return BLOCK.init(0), td, fd.random.key(7)


# The fresh process: the same inputs (seeded), the artifact loaded and called, its
# outputs written back as plain tensors, and what only that process can see.
FRESH = """
import sys, torch, functd as fd
sys.path.insert(0, {root!r})
from tests.test_jit_artifacts import _inputs, SCALE
params, td, key = _inputs()
run = fd.load_compiled({path!r})
out, extra = run(params, td, key, SCALE)
assert type(out) is fd.TensorDict and out.batch_size == torch.Size([4]), out
assert extra["x"] is td["x"] and extra["n"] == 3 and extra["dtype"] is torch.float32
torch.save({{k: out[k] for k in out.keys()}}, {result!r})
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(jitted, lowered, path of the saved artifact)."""
    jitted = fd.jit(step, static_argnums=3, backend="fx")
    params, td, key = _inputs()
    lowered = jitted.lower(params, td, key, SCALE)
    folder = tmp_path_factory.mktemp("artifacts")
    os.chmod(folder, 0o700)
    path = folder / "step.pt2"
    lowered.save(path)
    return jitted, lowered, path


@pytest.fixture(scope="module")
def loaded(saved):
    return fd.load_compiled(saved[2])


def _forged(path, dest, **changes):
    """A copy of the artifact at ``path`` with its functd.json changed."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(dest, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/extra/functd.json"):
                meta = json.loads(data)
                meta.update(changes)
                data = json.dumps(meta).encode()
            out.writestr(info, data)
    os.chmod(dest, 0o644)
    return dest


def test_a_saved_artifact_runs_in_a_fresh_process_like_the_jitted_call(saved, tmp_path):
    jitted, _, path = saved
    params, td, key = _inputs()
    want, _ = jitted(params, td, key, SCALE)
    result = tmp_path / "out.pt"
    code = FRESH.format(root=os.getcwd(), path=str(path), result=str(result))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    got = torch.load(result, weights_only=True)
    assert list(got) == list(want.keys())  # the same keys in the same order
    for k, v in want.items():
        assert_close(got[k], v)


def test_lower_keeps_its_fields_and_compile_gives_the_jitted_values(saved):
    jitted, lowered, _ = saved
    assert "static 2.0" in lowered.signature and lowered.dynamic == ()
    assert "addmm" in lowered.graph and lowered.source is None  # fx: no generated code
    assert str(lowered).startswith("# signature: args[0]: TensorDict(")
    compiled = lowered.compile()
    assert compiled is lowered.compile()  # compiled once
    params, td, key = _inputs()
    (got, extra), (want, _) = compiled(params, td, key, SCALE), jitted(params, td, key, SCALE)
    assert_close(got, want)
    assert list(got.keys()) == list(want.keys()) and got.batch_size == want.batch_size
    assert extra["x"] is td["x"]  # an input passed through is the caller's tensor
    assert (extra["n"], extra["dtype"]) == (3, torch.float32)
    other_key = fd.random.key(8)  # the key is an input: another key, other draws
    assert not torch.equal(compiled(params, td, other_key, SCALE)[0]["noisy"], got["noisy"])


def test_a_call_of_another_signature_names_the_path_expected_and_got(loaded):
    params, td, key = _inputs()
    with pytest.raises(
        TypeError,
        match=r"args\[1\]\['x'\]: expected dtype torch.float32; "
        r"got torch.float64\. A compiled artifact runs one signature",
    ):
        loaded(params, td.set("x", td["x"].double()), key, SCALE)
    with pytest.raises(
        TypeError,
        match=r"args\[1\]: expected a TensorDict with keys "
        r"\[\"\['x'\]\"\] and batch size \[4\]; got .* batch size \[5\]",
    ):
        loaded(params, _inputs(5)[1], key, SCALE)
    with pytest.raises(TypeError, match=r"args\[3\]: expected the static value 2\.0; got 3\.0"):
        loaded(params, td, key, 3.0)
    with pytest.raises(
        TypeError,
        match=r"expected args\[0\], args\[1\], args\[2\], args\[3\]; "
        r"got args\[0\], args\[1\]",
    ):
        loaded(params, td)


def test_an_artifact_of_another_torch_or_cpu_is_refused_before_loading(saved, tmp_path):
    path = saved[2]
    other = _forged(path, tmp_path / "torch.pt2", torch="2.12.0")
    with pytest.raises(
        RuntimeError,
        match=r"the artifact was built by torch 2\.12\.0; this is "
        rf"torch {re.escape(torch.__version__)}\. .*lower and save it again",
    ):
        fd.load_compiled(other)
    cpu = "AVX2" if torch.backends.cpu.get_cpu_capability() != "AVX2" else "AVX512"
    other = _forged(path, tmp_path / "cpu.pt2", cpu_capability=cpu)
    with pytest.raises(
        RuntimeError,
        match=rf"built for the CPU capability {cpu}; this CPU's is "
        rf"{torch.backends.cpu.get_cpu_capability()} \(",
    ):
        fd.load_compiled(other)


def test_a_file_or_folder_other_users_can_write_is_refused(saved, tmp_path):
    path = tmp_path / "open.pt2"
    path.write_bytes(saved[2].read_bytes())
    os.chmod(tmp_path, 0o700)
    os.chmod(path, 0o666)
    with pytest.raises(
        PermissionError,
        match=r"the file .*open\.pt2 can be written by other "
        r"users \(mode 0o666\); loading an artifact runs its shared library",
    ):
        fd.load_compiled(path)
    os.chmod(path, 0o644)
    os.chmod(tmp_path, 0o777)
    try:
        with pytest.raises(PermissionError, match=r"the folder .* \(mode 0o777\)"):
            fd.load_compiled(path)
    finally:
        os.chmod(tmp_path, 0o700)


def test_a_file_that_is_not_an_artifact_is_refused(tmp_path):
    path = tmp_path / "w.pt2"
    path.write_bytes(b"not a zip")
    os.chmod(path, 0o644)
    os.chmod(tmp_path, 0o700)
    with pytest.raises(ValueError, match=r"not an artifact of fd\.jit .*Lowered\.save"):
        fd.load_compiled(path)


def test_an_artifact_that_computes_nothing_needs_no_compile(tmp_path):
    td = _inputs()[1]
    lowered = fd.jit(lambda td, n: (td, n, None), backend="fx").lower(td, 3)
    lowered.save(tmp_path / "same.pt2")
    os.chmod(tmp_path, 0o700)
    out, n, none = fd.load_compiled(tmp_path / "same.pt2")(td, 3)
    assert out is not td and out["x"] is td["x"] and out.batch_size == td.batch_size
    assert (n, none) == (3, None)
    with pytest.raises(TypeError, match=r"args\[1\]: expected 3; got 4\. "):
        lowered.compile()(td, 4)


def test_outputs_and_static_values_json_cannot_hold_are_refused_when_compiled():
    td = _inputs()[1]
    point = collections.namedtuple("point", "x y")
    with pytest.raises(
        TypeError,
        match=r"the output is a point; a saved artifact rebuilds "
        r"TensorDicts, tuples, lists and dicts",
    ):
        fd.jit(lambda td: point(td["x"], 1), backend="fx").lower(td).compile()
    jitted = fd.jit(lambda td, f: f(td["x"]), static_argnums=1, backend="fx")
    with pytest.raises(
        TypeError,
        match=r"the static argument args\[1\] is a builtin_function_or"
        r"_method; a saved artifact compares non-tensor inputs .* by value",
    ):
        jitted.lower(td, torch.tanh).compile()

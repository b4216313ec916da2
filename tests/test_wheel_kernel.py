"""The wheel carries the fused kernel: ``python -m build`` compiles functd/_fused_ext.c
(and functd/_td/_alloc_ext.c) into the wheel, which installs into a fresh venv and draws through the extension in a
process with no C compiler (``CC=/bin/false``, no PATH) and an empty home: nothing is
compiled or loaded from a writable place at run time.

And the other side: an sdist installed where no compiler is found installs without the
extension (it is optional), and the first draw warns once and keeps the bits.

Not marked ``slow``: the two take ~1 min on the 2-core machine (isolated build
environments, one compile, two venvs) and every ``make test``/CI run checks them
(issue 22). tests/test_wheel.py (marked ``slow``) checks the whole wheel against the
README.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import venv

import pytest
import torch

import functd.random as fr
from functd import _fused

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = """
import json, sys, warnings
warnings.simplefilter("error")
import torch, functd, functd.random as fr, functd._fused as f
keys = fr.split(fr.key(11), 3)
draws = {
    "normal": fr.normal(keys, (300,)).view(torch.int32),
    "uniform": torch.func.vmap(lambda k: fr.uniform(k, (7,), minval=-1.0, maxval=2.0))(keys),
    "split": fr.split(keys, 2),
}
td = functd.TensorDict({"a": torch.ones(2, 3)}, [2]).set("b", torch.zeros(2))
print(json.dumps({
    "file": functd.__file__, "ext": sys.modules["functd._fused_ext"].__file__,
    "alloc": getattr(sys.modules.get("functd._td._alloc_ext"), "__file__", None),
    "td": [list(td.keys()), list(td.batch_size), td["a"].sum().item()],
    "variant": f.variant(), "draws": {k: v.view(torch.int32).tolist() for k, v in draws.items()},
}))
"""


def run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{cmd[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def source_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """The checkout's files (the build writes build/ and *.egg-info next to them)."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "*.so")
    shutil.copytree(ROOT, src, ignore=skip)
    return src


def fresh_venv(tmp_path: pathlib.Path) -> pathlib.Path:
    """A new venv that sees this environment's torch and optree, not its functd."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    # a path, not a site dir: none of its .pth files, so not this checkout's editable
    # functd
    pathlib.Path(purelib.stdout.strip(), "deps.pth").write_text(site.getsitepackages()[0])
    return py


def no_compiler_env(tmp_path: pathlib.Path) -> dict:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FUNCTD"))}
    env.update(CC="/bin/false", PATH="/nonexistent", HOME=str(home))
    env["XDG_CACHE_HOME"] = str(home / ".cache")
    return env


def pure_draws() -> dict:
    keys = fr.split(fr.key(11), 3)
    saved, _fused._KERNEL = _fused._KERNEL, False  # this process, the pure path
    try:
        want = {
            "normal": fr.normal(keys, (300,)),
            "uniform": fr.uniform(keys, (7,), minval=-1.0, maxval=2.0),
            "split": fr.split(keys, 2),
        }
    finally:
        _fused._KERNEL = saved
    return {k: v.view(torch.int32).tolist() for k, v in want.items()}


def test_wheel_built_with_python_m_build_draws_through_the_extension(tmp_path):
    pytest.importorskip("build")
    src, dist = source_copy(tmp_path), tmp_path / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)], cwd=src)
    (wheel,) = dist.glob("functd-*.whl")
    assert "none-any" not in wheel.name  # a platform wheel: it holds the compiled kernel
    py = fresh_venv(tmp_path)
    run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)])
    env, cwd = no_compiler_env(tmp_path), tmp_path / "cwd"
    cwd.mkdir()
    done = run([str(py), "-c", PROBE], cwd=cwd, env=env)
    assert done.stderr == ""  # no warning: the extension served
    got = json.loads(done.stdout)
    assert pathlib.Path(got["file"]).is_relative_to(tmp_path / "venv")  # the wheel's functd
    assert pathlib.Path(got["ext"]).parent == pathlib.Path(got["file"]).parent
    assert pathlib.Path(got["alloc"]).parent == pathlib.Path(got["file"]).parent / "_td"
    assert got["td"] == [["a", "b"], [2], 6.0]
    assert got["variant"] in ("avx512f", "avx2", "baseline")
    assert got["draws"] == pure_draws()
    assert list(pathlib.Path(env["HOME"]).iterdir()) == [] and list(cwd.iterdir()) == []


def test_sdist_installed_without_a_compiler_warns_once_and_keeps_the_bits(tmp_path):
    """The extension is optional: no compiler at install, functd installs without it;
    the first draw says why in one warning, and the pure path gives the same bits."""
    pytest.importorskip("build")
    src, dist = source_copy(tmp_path), tmp_path / "dist"
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(src)], cwd=src)
    (sdist,) = dist.glob("functd-*.tar.gz")
    py, env = fresh_venv(tmp_path), no_compiler_env(tmp_path)
    # build with this environment's setuptools (the venv's own may predate bdist_wheel)
    run([str(py), "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
    install = [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    run([*install, "--no-build-isolation", str(sdist)], env={**env, "PATH": os.environ["PATH"]})
    probe = PROBE.replace('warnings.simplefilter("error")', "")
    probe = probe.replace('"ext": sys.modules["functd._fused_ext"].__file__', '"ext": None')
    done = run([str(py), "-W", "always", "-c", probe], cwd=tmp_path, env=env)
    warned = [ln for ln in done.stderr.splitlines() if "RuntimeWarning" in ln]
    assert len(warned) == 1 and "functd._fused_ext" in warned[0], done.stderr
    assert "FUNCTD_FUSED_RANDOM=0" in warned[0]
    got = json.loads(done.stdout)
    assert got["variant"] is None and got["draws"] == pure_draws()
    assert got["alloc"] is None and got["td"] == [["a", "b"], [2], 6.0]  # the Python path

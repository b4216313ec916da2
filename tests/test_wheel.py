"""The wheel carries the fused kernel: ``python -m build`` compiles functd/_fused_ext.c
into the wheel, which installs into a fresh venv and draws through the extension in a
process with no C compiler (``CC=/bin/false``, no PATH) and an empty home: nothing is
compiled or loaded from a writable place at run time.

Marked ``slow`` (~30 s idle, ~1 min on a loaded 2-core machine: two isolated build
environments, one compile, one venv); CI runs it. ``pytest -m "not slow"`` skips it.
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
print(json.dumps({
    "file": functd.__file__, "ext": sys.modules["functd._fused_ext"].__file__,
    "variant": f.variant(), "draws": {k: v.view(torch.int32).tolist() for k, v in draws.items()},
}))
"""


def run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{cmd[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_wheel_built_with_python_m_build_draws_through_the_extension(tmp_path):
    pytest.importorskip("build")
    src, dist = tmp_path / "src", tmp_path / "dist"  # a copy: the build writes build/ there
    skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "*.so")
    shutil.copytree(ROOT, src, ignore=skip)
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)], cwd=src)
    (wheel,) = dist.glob("functd-*.whl")
    assert "none-any" not in wheel.name  # a platform wheel: it holds the compiled kernel
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    # torch and optree from this environment (a path, not a site dir: none of its .pth
    # files, so not this checkout's editable functd), the wheel installed on top
    pathlib.Path(purelib.stdout.strip(), "deps.pth").write_text(site.getsitepackages()[0])
    run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)])
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FUNCTD"))}
    env.update(CC="/bin/false", PATH="/nonexistent", HOME=str(home))
    env["XDG_CACHE_HOME"] = str(home / ".cache")
    done = run([str(py), "-c", PROBE], cwd=cwd, env=env)
    assert done.stderr == ""  # no warning: the extension served
    got = json.loads(done.stdout)
    assert pathlib.Path(got["file"]).is_relative_to(env_dir)  # the wheel's functd
    assert pathlib.Path(got["ext"]).parent == pathlib.Path(got["file"]).parent
    assert got["variant"] in ("avx512f", "avx2", "baseline")
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
    assert got["draws"] == {k: v.view(torch.int32).tolist() for k, v in want.items()}
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []

"""Build functd's sdist and wheel, check them, install the wheel in a fresh venv and run
the README there.

Steps (each prints its time; any failure exits non-zero):

1. ``python -m build`` into ``OUT/dist`` (an sdist and a wheel; the ``release`` extra
   brings ``build`` and ``twine``);
2. ``twine check --strict`` on both;
3. a fresh venv ``OUT/venv`` (no access to this checkout's packages), then
   ``pip install TORCH`` (default ``torch==2.13.0``, as the Makefile) and
   ``pip install WHEEL[safetensors,models]``;
4. in that venv, from an empty folder outside the checkout: ``functd`` is the
   installed wheel (its ``__version__``, its ``py.typed``), and every python block of
   README.md runs top to bottom in one namespace (as tests/test_readme.py runs them on
   the source tree).

Run: ``.venv/bin/python tools/check_wheel.py [OUT]`` (OUT defaults to a temporary
folder, removed at the end), or ``make wheel-check``; ``tests/test_wheel.py`` (marked
``slow``, run with ``FUNCTD_SLOW=1``) runs it. It takes about 2-3 minutes on the
2-core CI machine with the packages in pip's cache (see notes/docs.md for a measured
run); the first run downloads torch and transformers' dependencies.

Example:
    >>> subprocess.run([sys.executable, "tools/check_wheel.py"], check=True)
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = os.environ.get("TORCH", "torch==2.13.0")

RUN_README = r"""
import os, re, sys, tempfile, warnings
import functd
where = os.path.dirname(functd.__file__)
assert where.startswith(sys.prefix), f"functd imported from {where}, not the venv"
assert os.path.isfile(os.path.join(where, "py.typed")), "py.typed is not installed"
print("functd", functd.__version__, "from", where)
text = open(sys.argv[1]).read()
blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
assert len(blocks) >= 7, len(blocks)
os.chdir(tempfile.mkdtemp())
ns = {"__name__": "__readme__"}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # tests/test_readme.py pins the warnings
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i}", "exec"), ns)
print(f"README: {len(blocks)} python blocks ran")
"""


def _run(title: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    start = time.perf_counter()
    print(f"== {title}: {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-6000:], done.stderr[-6000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"check_wheel: {title} failed (exit {done.returncode})")
    print(f"   ok in {seconds:.1f}s", flush=True)
    return done


def check(out: Path) -> None:
    dist = out / "dist"
    _run("build", [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)])
    wheels = glob.glob(str(dist / "*.whl"))
    sdists = glob.glob(str(dist / "*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, (wheels, sdists)
    _run("twine check", [sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists])
    venv = out / "venv"
    _run("venv", [sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run("install torch", [*pip, TORCH])
    _run("install the wheel", [*pip, f"{wheels[0]}[safetensors,models]"])
    empty = out / "run"
    empty.mkdir()
    script = empty / "run_readme.py"
    script.write_text(RUN_README)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = _run("README", [py, str(script), str(ROOT / "README.md")], cwd=empty, env=env)
    print(done.stdout.strip())


def main() -> None:
    start = time.perf_counter()
    if len(sys.argv) > 1:
        out = Path(sys.argv[1]).resolve()
        out.mkdir(parents=True, exist_ok=True)
        check(out)
    else:
        with tempfile.TemporaryDirectory(prefix="functd-wheel-") as tmp:
            check(Path(tmp))
    print(f"check_wheel: all good in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()

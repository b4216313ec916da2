"""A compiled fd.vmap ensemble does the work of torch's own ensemble, no more.

The reference is torch's recipe: ``torch.func.stack_module_state`` and
``torch.vmap(functional_call)`` over the same members, compiled by torch.compile
(inductor). The functd ensemble, compiled by torch.compile and by fd.jit, must be one
graph (``fullgraph=True``: a graph break inside fd.vmap makes dynamo run the whole
vmap eagerly, which is what the first GPU run measured, on torch 2.11), and its
generated code must have no more kernels, copies, allocations or extern calls than
the reference's, with the members' matmuls one ``bmm`` each. The traced graph must not
grow with the member count (no per-member ops: unbinds, stacks, copies).

Counted from the code torch generates (``run_and_get_code``, fd.jit's ``lower``): a
tiny block, one inductor compile per version, shared by the asserts.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn
from torch._inductor.utils import run_and_get_code
from torch.func import functional_call, stack_module_state

import functd as fd

pytestmark = pytest.mark.compile
BATCH = 5


class Block(nn.Module):
    """The tutorial's residual block, small."""

    def __init__(self) -> None:
        super().__init__()
        self.linear0 = nn.Linear(3, 8)
        self.linear1 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear1(torch.relu(self.linear0(x))) + x


def _functd(ref: Block) -> fd.Sequential:
    return fd.Sequential(
        fd.Module(ref.linear0, ["x"], ["h"]),
        fd.Module(torch.relu, ["h"], ["a"]),
        fd.Module(ref.linear1, ["a"], ["z"]),
        fd.Module(lambda x, z: x + z, ["x", "z"], ["y"]),
        selected_out_keys=["y"],
    )


def _ensemble(n: int):
    """``(nets, x, functd forward, its args, torch's forward, its args)``: n members."""
    torch.manual_seed(0)
    nets = [Block() for _ in range(n)]
    x = torch.randn(BATCH, 3)
    params, buffers = stack_module_state(nets)
    base = copy.deepcopy(nets[0]).to("meta")

    def member(p, b, x):
        return functional_call(base, (p, b), (x,))

    def sms_forward(p, b, x):
        return torch.vmap(member, in_dims=(0, 0, None))(p, b, x)

    block = _functd(nets[0])
    ens = fd.stack([fd.from_module(_functd(net)) for net in nets])
    mapped = fd.vmap(block, in_dims=(0, None))

    def fd_forward(ens, td):
        return mapped(ens, td)["y"]

    td = fd.TensorDict({"x": x}, [BATCH])
    return nets, x, fd_forward, (ens, td), sms_forward, (params, buffers, x)


def _python_counts(code: str) -> dict[str, int]:
    """What inductor's Python wrapper (``def call``) runs: kernels, extern calls, ATen
    fallbacks, buffers allocated; and the kernels that only copy."""
    body = code[code.index("def call(") :]
    return {
        "kernels": len(re.findall(r"^\s+cpp_fused_\w+\(", body, re.M)),
        "copy kernels": len(re.findall(r"^\s+cpp_fused_\w*(?:clone|copy)\w*\(", body, re.M)),
        "extern calls": len(re.findall(r"extern_kernels\.\w+\(", body)),
        "aten fallbacks": len(re.findall(r"torch\.ops\.aten\.\w+", body)),
        "allocations": len(re.findall(r"empty_strided\w*\(", body)),
    }


def _cpp_counts(code: str) -> dict[str, int]:
    """The same counts in fd.jit's C++ wrapper (``inductor_entry_impl``)."""
    body = code[code.index("inductor_entry_impl") :]
    body = body[: body.index("} // inductor_entry_impl")]
    return {
        "kernels": len(re.findall(r"\bcpp_fused_\w+\(\(", body)),
        "copy kernels": len(re.findall(r"\bcpp_fused_\w*(?:clone|copy)\w*\(\(", body)),
        "extern calls": len(re.findall(r"aoti_torch_cpu_\w+\(", body)),
        "aten fallbacks": len(re.findall(r"aoti_torch_proxy_executor_call_function", body)),
        "allocations": len(re.findall(r"aoti_torch_empty_strided\(", body)),
    }


@pytest.fixture(scope="module")
def compiled():
    """Each version compiled once (4 members), its output and generated code."""
    nets, x, fd_forward, fd_args, sms_forward, sms_args = _ensemble(4)
    with torch.no_grad():
        want = torch.stack([net(x) for net in nets])
        sms_out, (sms_code,) = run_and_get_code(
            torch.compile(sms_forward, fullgraph=True), *sms_args
        )
        fd_out, (fd_code,) = run_and_get_code(torch.compile(fd_forward, fullgraph=True), *fd_args)
    jitted = fd.jit(fd_forward)
    return {
        "want": want,
        "sms": (sms_out, sms_code),
        "fd": (fd_out, fd_code),
        "jit": (jitted(*fd_args), jitted.lower(*fd_args).source),
    }


def test_compiled_fd_vmap_ensemble_equals_the_loop_over_torch_modules(compiled):
    for name in ("sms", "fd", "jit"):
        torch.testing.assert_close(compiled[name][0], compiled["want"], msg=name)


def test_torch_compile_of_fd_vmap_does_no_more_work_than_stack_module_state(compiled):
    sms, got = _python_counts(compiled["sms"][1]), _python_counts(compiled["fd"][1])
    assert got["copy kernels"] == 0, got
    for what, n in got.items():
        assert n <= sms[what], (what, got, sms)
    # the members' matmuls: one batched matmul per layer, as torch's
    assert re.findall(r"extern_kernels\.(\w+)\(", compiled["fd"][1]) == ["bmm", "bmm"]


def test_fd_jit_of_fd_vmap_does_no_more_work_than_stack_module_state(compiled):
    """fd.jit's own passes (its bmm operand layouts) add nothing: the shared data
    stays one expanded view (it was copied once per member, a kernel more)."""
    sms, got = _python_counts(compiled["sms"][1]), _cpp_counts(compiled["jit"][1])
    assert got["copy kernels"] == 0, got
    for what, n in got.items():
        assert n <= sms[what], (what, got, sms)
    assert re.findall(r"aoti_torch_cpu_(\w+)\(", compiled["jit"][1]).count("bmm_out") == 2


_PER_MEMBER = re.compile(r"aten\.(unbind|select|stack|cat|clone|copy|_to_copy|index)\w*\.")


def _ops(graph: str) -> list[str]:
    return re.findall(r"torch\.ops\.([\w.]+)\(", graph)


def test_the_traced_ensemble_has_no_per_member_ops():
    """The graph fd.jit traces (ATen ops, after inductor's decompositions) is the same at
    2 and 4 members: nothing is done once per member."""
    graphs = []
    for n in (2, 4):
        _, _, fd_forward, fd_args, _, _ = _ensemble(n)
        with torch.no_grad():
            graphs.append(fd.jit(fd_forward, backend="fx").lower(*fd_args).graph)
    two, four = (_ops(g) for g in graphs)
    assert two == four
    assert two.count("aten.bmm.default") == 2
    assert not _PER_MEMBER.findall("\n".join(graphs)), graphs[1]


def test_a_compiled_fd_vmap_ensemble_compiles_once_for_reused_and_new_inputs():
    """Flattening a TensorDict under torch.compile writes nothing into it: writing its
    cached tree spec was a side effect replayed after every call on a new TensorDict,
    and its guard (``td._spec is None``) failed on the next call, a second compile;
    with a new TensorDict each call, a third."""
    from torch._dynamo.testing import CompileCounter

    _, x, fd_forward, (ens, td), _, _ = _ensemble(2)
    counter = CompileCounter()
    f = torch.compile(fd_forward, backend=counter, fullgraph=True)
    before = (td._spec, ens._spec)
    with torch.no_grad():
        outs = [f(ens, td), f(ens, td), f(ens, fd.TensorDict({"x": x}, [BATCH]))]
    assert counter.frame_count == 1
    assert (td._spec, ens._spec) == before  # nothing written into the inputs
    for out in outs:
        torch.testing.assert_close(out, fd_forward(ens, td))

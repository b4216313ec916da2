"""Inductor's options for one fd.jit graph: how its code runs and how fast it compiles.

``compile_graph`` (``_jit_trace.py``) hands each traced graph to inductor under these
options. What each one is for (figures: notes/compile.md):

- ``cpp.min_chunk_size``: a CPU loop runs on several threads only from ATen's grain
  size (eager's rule), not inductor's 512: a fork-join per small kernel stalls on a
  shared machine;
- ``decompose_mm_pass``: a one-row matmul as a fused multiply-and-sum, not a BLAS call;
- ``realize_opcount_threshold`` pinned at inductor's default, 30;
- fd.jit's own post-grad passes (``_jit_passes.py``);
- **the C++ wrapper built apart from its kernels** for a big graph
  (``cpp_wrapper_build_separate``, the wrapper at ``WRAPPER_OPT``, -O1: inductor's
  default for that option). Inductor compiles a graph's C++ wrapper (the function
  that allocates buffers and calls the kernels, loop bodies inlined into it) and its
  kernels as one file at ``-O3``; g++'s ``-O3`` on a wrapper of thousands of lines is
  what a big graph's compile is made of (PPO's update: 108 of 151 CPU s in that
  file; apart, the wrapper takes 7.4 s at ``-O1``, 12.6 s at ``-O2``, the kernels 4.4 s
  at ``-O3``). The wrapper only sequences calls: PPO's update runs at par (11.1 ms
  one file, 11.3 ms -O1, 11.3 ms -O2, CPU ms, interleaved in one process). Small
  graphs keep the one file (apart costs them a second compile and header).

``vec_isa_checked_once`` (``functd._torch.inductor``) runs before the first CPU
compile: inductor's vector ISA picked at one probe compile instead of one per ISA.

Example:
    >>> options = inductor_options(t.gm, cpu=True)
    >>> with inductor_config.patch(options): ...
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch import CPP_WRAPPER_LOOPS
from .._torch.hop import scan_op, while_loop_op
from ._jit_passes import BatchOneBmm, PostGrad

__all__ = [
    "BIG_GRAPH",
    "GRAIN",
    "WRAPPER_OPT",
    "has_loop",
    "inductor_options",
    "is_big",
    "uses_cpp_wrapper",
]

# A CPU loop of the compiled code runs on several threads only when each gets at least
# this many elements: ATen's grain size (eager's rule), not inductor's default of 512.
# The graphs fd.jit sees are small models (many short kernels), where a fork-join per
# kernel costs more than it saves, and stalls whenever another process holds a core.
GRAIN = 32768
#: graph nodes from which the C++ wrapper is built apart, at ``WRAPPER_OPT`` (a graph
#: with a loop op is big whatever its size). Measured: apart costs small graphs more
#: than it saves (a second compile and header): the tutorial block (10 nodes) 9.5
#: against 8.2 CPU s, a 2-layer BERT (183 nodes) 12.2 against 10.0; PPO's update (loops)
#: 68 against 151. 1000 is a guess between (an unrolled loop, a model 5x BERT's size)
BIG_GRAPH = 1000
#: g++'s optimisation level for a big graph's C++ wrapper (its kernels keep -O3)
WRAPPER_OPT = "O1"


def has_loop(gm: torch.fx.GraphModule) -> bool:
    """``gm`` holds a loop: a subgraph (a loop op's body or condition) or a call of
    torch's scan / while_loop op."""
    if any(n.target in (scan_op, while_loop_op) for n in gm.graph.nodes):
        return True
    return any(sub is not gm for _, sub in gm.named_modules() if hasattr(sub, "graph"))


def uses_cpp_wrapper(gm: torch.fx.GraphModule, cpu: bool, loops: bool = CPP_WRAPPER_LOOPS) -> bool:
    """Inductor's C++ wrapper (called without its Python shim, ``Direct``) for a graph
    whose inputs are all on the CPU; its Python wrapper on a GPU, and for a graph with a
    loop where the C++ wrapper cannot compile loops (``loops``: the version gate
    ``functd._torch.CPP_WRAPPER_LOOPS``, torch >= 2.13; 2.11 and 2.12 assert in
    ``codegen_while_loop``)."""
    if not cpu:
        return False
    return loops or not has_loop(gm)


def is_big(gm: torch.fx.GraphModule) -> bool:
    """A graph whose C++ wrapper is built apart: it has a loop op (torch's scan or
    while_loop, whose bodies the wrapper inlines) or ``BIG_GRAPH`` nodes or more."""
    return has_loop(gm) or len(gm.graph.nodes) >= BIG_GRAPH


def inductor_options(gm: torch.fx.GraphModule, cpu: bool) -> dict[str, Any]:
    """The inductor config fd.jit compiles ``gm`` under (``cpu``: its C++ wrapper is
    used, ``uses_cpp_wrapper``)."""
    options: dict[str, Any] = {
        "cpp.min_chunk_size": GRAIN,
        # a matmul with one row (batch 1) on the CPU as a fused multiply-and-sum rather
        # than a BLAS call (inductor's own pass, off by default): 3 addmm of the tutorial
        # block cost ~5 µs each in MKL's call overhead, the fused loops under 1 µs
        "post_grad_fusion_options": {"decompose_mm_pass": {}},
        # inductor's default, pinned: a pointwise value whose expression passes 30 ops
        # becomes a buffer. Lower compiles functd.random's threefry chains faster (one
        # PPO env step: 17.7 s with 16, 22.3 s with 30) but stores more of them: every
        # stored value is a buffer allocated in each step of a loop, and PPO's
        # one-agent update ran 18% slower with 16 (notes/compile.md). With 8,
        # inductor 2.13 computed PPO's vmapped loss gradient wrong (actor grads off by
        # up to 100%); a test pins it
        "realize_opcount_threshold": 30,
        # copying views fused (not a fallback call each), batched matmuls on batch-outer
        # operands (one GEMM, not one mm per batch element): _jit_passes.py
        "post_grad_custom_post_pass": PostGrad(),
        # a batch-one bmm as an mm, so the decomposition above keeps to one-row mms
        "post_grad_custom_pre_pass": BatchOneBmm(),
    }
    if cpu and is_big(gm):
        options["cpp_wrapper_build_separate"] = True
        options["aot_inductor.compile_wrapper_opt_level"] = WRAPPER_OPT
    return options

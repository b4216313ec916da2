"""fd.jit's own pass over inductor's post-grad graph: batched matmuls get row-major operands.

Inductor lays out an intermediate buffer as it likes, and a buffer it feeds to ATen's
``bmm`` (``extern_kernels.bmm``, which states no stride requirement) gets the order
that suits the kernel writing it. Under ``fd.vmap`` inside a loop (``fd.scan``:
torch's scan op keeps each carry's mapped dim last in memory) that order puts the
batch dim last, e.g. ``(64, 4, 64)`` with strides ``(1, 64, 256)``; ATen's ``bmm`` then
runs one ``mm`` per batch element on copied slices (PPO's rollout at 64 agents: 484 ms
compiled against 275 ms eager; notes/ppo.md). This pass routes each operand of a
``bmm`` with a batch of more than one through a row-major ``clone`` then
``as_strided`` with the row-major strides: as a graph, a row-major copy and the
identity view of it (values unchanged, the graph runs as it is); in inductor, whose
``clone`` leaves the layout open, ``as_strided`` fixes the copy's buffer to those
strides (its lowering freezes the layout of what it views), so the buffer is written
row-major and ``bmm`` runs one batched GEMM (186 ms). ``tests/test_jit.py`` runs the
rewritten graph and a compiled vmapped loop against eager.

Example:
    >>> options["post_grad_custom_post_pass"] = RowMajorBmm()
"""

from __future__ import annotations

import torch
from torch._guards import detect_fake_mode
from torch._inductor.custom_graph_pass import CustomGraphPass

__all__ = ["RowMajorBmm"]

_BMM = torch.ops.aten.bmm.default
_ROW_MAJOR = torch.contiguous_format


class RowMajorBmm(CustomGraphPass):
    """The pass (a ``CustomGraphPass``: its ``uuid`` keys inductor's graph cache)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not _BMM:
                continue
            for a in node.args[:2]:
                val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                if not isinstance(val, torch.Tensor) or val.ndim != 3:
                    continue
                b, m, k = val.shape
                if not (isinstance(b, int) and isinstance(m, int) and isinstance(k, int)):
                    continue  # (symbolic sizes: left as they are)
                if b <= 1:
                    continue
                size, stride = [b, m, k], [m * k, k, 1]
                with graph.inserting_before(node):
                    copy = graph.call_function(
                        torch.ops.aten.clone.default, (a,), {"memory_format": _ROW_MAJOR}
                    )
                    view = graph.call_function(
                        torch.ops.aten.as_strided.default, (copy, size, stride)
                    )
                with detect_fake_mode([val]) or torch._subclasses.FakeTensorMode():
                    new = torch.empty_strided(size, stride, dtype=val.dtype, device=val.device)
                copy.meta["val"] = view.meta["val"] = new
                node.replace_input_with(a, view)

    def uuid(self) -> str:
        return "functd-row-major-bmm-1"

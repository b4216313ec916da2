"""fd.jit's own passes over inductor's post-grad graph: batched matmuls get batch-outer
operands (row-major or transposed), and copying views become views and a copy inductor
can fuse.

Inductor lays out an intermediate buffer as it likes, and a buffer it feeds to ATen's
``bmm`` (``extern_kernels.bmm``, which states no stride requirement) gets the order
that suits the kernel writing it. Under ``fd.vmap`` inside a loop (``fd.scan``; with
torch's vmap rule for the scan op, which keeps each carry's mapped dim last in memory,
before functd's own rule kept it first) that order can put the batch dim last, e.g.
``(64, 4, 64)`` with strides ``(1, 64, 256)``; ATen's ``bmm`` then
runs one ``mm`` per batch element on copied slices (PPO's rollout at 64 agents: 484 ms
compiled against 275 ms eager; notes/ppo.md). This pass routes each operand of a
``bmm`` with a batch of more than one through inductor's own
``prims.inductor_force_stride_order`` with the row-major strides: as a graph, the
operand itself (or a row-major copy); in inductor, a requirement that the buffer be
row-major (a copy only if it is not), so ``bmm`` runs one batched GEMM (the rollout:
186 ms; an earlier ``clone`` + ``as_strided`` did the same by reinterpreting memory).
An operand stored transposed with the batch outer (``x @ W.T``) keeps that layout
(MKL reads it with a transpose flag), and a view of a graph input keeps the layout it is
given, with no requirement: copying them row-major transposed or copied every weight in
each step of PPO's rollout. An operand expanded over the batch (stride 0: the data an
ensemble's members share, ``fd.vmap(block, in_dims=(0, None))``) stays a view too: a
row-major requirement copied it once per member, a kernel more than torch.compile's code.
``tests/test_jit.py`` runs the rewritten graph and a compiled vmapped loop against
eager.

The loop bodies of torch's scan op reach inductor with copying views
(``select_copy``, ``slice_copy``, ``detach_copy``: a scan's slice of its inputs, an
``unbind`` of a key, a constant) which inductor has no lowering for: each ran as a
fallback through inductor's proxy executor, an ATen call (and a ``clone``) per op
per loop step; PPO's one-agent rollout spent 40% of its time there (notes/ppo.md).
``FuseCopyViews`` rewrites each into the view and a ``clone`` to the standard strides
(what the copying op returns), which inductor fuses into the loops that read it.

A batched matmul with a batch of one (``fd.vmap`` over one agent) is an ``mm``
(``BatchOneBmm``, a pre-pass): inductor's ``decompose_mm_pass`` (which fd.jit turns on
for one-row ``mm``s, where a BLAS call costs more than the fused loops) otherwise
takes every batch-one ``bmm`` apart into multiply-and-sum loops whatever its size,
and PPO's [128, 4] @ [4, 64] layer became a scalar loop with a scalar ``tanh``;
as an ``mm`` (from ``MM_ROWS`` rows: below, the fused loops beat a BLAS call) it
keeps the decomposition only for one row.

Example:
    >>> options["post_grad_custom_pre_pass"] = BatchOneBmm()
    >>> options["post_grad_custom_post_pass"] = PostGrad()
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch.fake import FakeTensorMode, detect_fake_mode
from .._torch.inductor import CustomGraphPass  # (also registers prims.inductor_force_stride_order)

__all__ = ["BatchOneBmm", "FuseCopyViews", "PostGrad", "RowMajorBmm"]

_aten = torch.ops.aten
_BMM = _aten.bmm.default
_ROW_MAJOR = torch.contiguous_format
#: inductor's own "these strides, copying if needed" (a no-op as a graph when they are)
_FORCE_STRIDES = torch.ops.prims.inductor_force_stride_order.default


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
                if _shared(val, m, k):
                    continue  # one matrix for every batch element (shared data): a view
                # batch outer and each matrix dense, row-major or transposed: MKL reads
                # either (a transpose flag), so a transposed view stays a view. Copying
                # it row-major was a transpose of every weight in each step of a loop
                # (x @ W.T; PPO at 256 agents: 4 MB a layer a rollout step). Also
                # through copies of one (a loop body's ``permute_copy`` reaches the
                # pass as a permute and a row-major ``clone``)
                src = _unchanged_source(a, val.shape)
                transposed = _transposed(src.meta["val"], m, k)
                stride = [m * k, 1, m] if transposed else [m * k, k, 1]
                if (transposed or src.meta["val"].stride() == tuple(stride)) and _input_view(src):
                    # a view of an input has the layout it is given: the requirement
                    # would copy it (inductor copies a loop body's input so, each step)
                    node.replace_input_with(a, src)
                    continue
                with graph.inserting_before(node):
                    view = graph.call_function(_FORCE_STRIDES, (src if transposed else a, stride))
                with detect_fake_mode([val]) or FakeTensorMode():
                    new = torch.empty_strided([b, m, k], stride, dtype=val.dtype, device=val.device)
                view.meta["val"] = new
                node.replace_input_with(a, view)

    def uuid(self) -> str:
        return "functd-bmm-operands-6"


def _shared(val: torch.Tensor, m: int, k: int) -> bool:
    """Whether ``val`` ([b, m, k]) is one dense matrix expanded over the batch (batch
    stride 0: the data an ensemble's members share, ``fd.vmap(f, in_dims=(0, None))``).
    BLAS reads it as it is (MKL and cuBLAS take a batch stride of 0); a row-major
    requirement copied it ``b`` times, one more kernel per call."""
    _, s1, s2 = val.stride()
    rows = (s2 == 1 or k == 1) and (s1 == k or m == 1)
    cols = (s1 == 1 or m == 1) and (s2 == m or k == 1)
    return val.stride()[0] == 0 and (rows or cols)


def _transposed(val: torch.Tensor, m: int, k: int) -> bool:
    """Whether ``val`` ([b, m, k]) is batch-outer matrices stored column-major."""
    return m > 1 and k > 1 and val.stride() == (m * k, 1, m)


#: ops that give their input's values in the same shape (a copy at most)
_SAME_VALUES = {
    _aten.clone.default,
    _aten.expand.default,
    _aten.reshape.default,
    _aten.view.default,
    _aten.alias.default,
}


def _input_view(a: torch.fx.Node) -> bool:
    """Whether ``a`` is a graph input or views of one (torch's ``OpOverload.is_view``;
    ``reshape`` as traced counts: where it copies, its result is row-major)."""
    while (
        a.op == "call_function"
        and getattr(a.target, "is_view", False)
        and isinstance(a.args[0], torch.fx.Node)
    ):
        a = a.args[0]
    return a.op == "placeholder"


def _unchanged_source(a: torch.fx.Node, shape: Any) -> torch.fx.Node:
    """The earliest node ``a`` copies or views unchanged (same shape, same values)."""
    while (
        a.op == "call_function"
        and a.target in _SAME_VALUES
        and isinstance(a.args[0], torch.fx.Node)
        and isinstance(v := a.args[0].meta.get("val"), torch.Tensor)
        and v.shape == shape
    ):
        a = a.args[0]
    return a


#: a copying view -> the view it copies
_COPY_VIEWS = {
    _aten.select_copy.int: _aten.select.int,
    _aten.slice_copy.Tensor: _aten.slice.Tensor,
    _aten.detach_copy.default: _aten.alias.default,
}


class FuseCopyViews(CustomGraphPass):
    """``select_copy(x, ...)`` -> ``clone(select(x, ...))``, likewise ``slice_copy`` and
    ``detach_copy`` (as ``alias``): the same values in a fresh tensor of the same strides."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            view = _COPY_VIEWS.get(node.target) if node.op == "call_function" else None
            val = node.meta.get("val")
            src = node.args[0] if node.args else None
            src_val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
            if view is None or not isinstance(val, torch.Tensor) or src_val is None:
                continue
            with graph.inserting_before(node):
                v = graph.call_function(view, node.args, node.kwargs)
                copy = graph.call_function(_aten.clone.default, (v,), {"memory_format": _ROW_MAJOR})
            with detect_fake_mode([val]) or FakeTensorMode():
                v.meta["val"] = view(src_val, *node.args[1:], **node.kwargs)
            copy.meta["val"] = val
            node.replace_all_uses_with(copy)
            graph.erase_node(node)

    def uuid(self) -> str:
        return "functd-fuse-copy-views-1"


class PostGrad(CustomGraphPass):
    """fd.jit's post-grad pass: ``FuseCopyViews`` then ``RowMajorBmm``."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        FuseCopyViews()(graph)
        RowMajorBmm()(graph)

    def uuid(self) -> str:
        return FuseCopyViews().uuid() + "+" + RowMajorBmm().uuid()


#: from how many rows a batch-one bmm becomes an mm (PPO at one agent: its 4-row
#: rollout matmuls ran 1.9x faster decomposed, its 128-row minibatch ones 1.6x
#: slower: notes/compile.md)
MM_ROWS = 16


class BatchOneBmm(CustomGraphPass):
    """``bmm(a, b)`` with a batch of one and ``MM_ROWS`` rows or more ->
    ``mm(a[0], b[0])[None]`` (the same values)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not _BMM:
                continue
            a, b = node.args[:2]
            vals: list[Any] = [
                x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (a, b)
            ]
            val: Any = node.meta.get("val")
            if not all(isinstance(v, torch.Tensor) for v in (*vals, val)):
                continue
            if not all(isinstance(v.shape[0], int) and v.shape[0] == 1 for v in vals):
                continue
            rows = vals[0].shape[1]
            if not isinstance(rows, int) or rows < MM_ROWS:
                continue  # a few rows: the fused loops beat a BLAS call
            with graph.inserting_before(node):
                a2 = graph.call_function(_aten.squeeze.dim, (a, 0))
                b2 = graph.call_function(_aten.squeeze.dim, (b, 0))
                mm = graph.call_function(_aten.mm.default, (a2, b2))
                out = graph.call_function(_aten.unsqueeze.default, (mm, 0))
            a2.meta["val"], b2.meta["val"] = vals[0].squeeze(0), vals[1].squeeze(0)
            mm.meta["val"] = val.squeeze(0)
            out.meta["val"] = val
            node.replace_all_uses_with(out)
            graph.erase_node(node)

    def uuid(self) -> str:
        return f"functd-batch-one-bmm-2-{MM_ROWS}"

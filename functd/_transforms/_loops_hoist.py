"""Loop-invariant carries of a traced scan op become inputs of the op.

A loop's carry often holds values the step only reads: PPO's rollout carries the
whole runner (params, optimizer state, env params: 52 of its 61 tensors) and changes
the key, the envs and the returns. Torch's scan op copies every carry each step (the
step's outputs are fresh tensors), and inductor's C++ loop allocates, copies and
hands over each one: at one agent the rollout spent about half its time in
``malloc``/``free`` (notes/ppo.md). XLA's while-loop simplifier moves such values out
of the loop; this does the same on the traced graph: a carry whose step output is the
same tensor as its input (through ``clone``, ``alias`` and ``permute``s that compose to
the identity: what ``fd.scan``'s canonical copies and torch's vmap rule leave) is
dropped from the carry and passed as an ``additional_input``; the op's outputs for it
are the value that went in.

Example:
    >>> out = hoist_invariants(fx_tracer, node, out, init_leaves)
"""

from __future__ import annotations

import operator
from typing import Any

import torch

__all__ = ["hoist_invariants"]

_aten = torch.ops.aten
_SAME = (_aten.clone.default, _aten.alias.default, _aten.detach.default)


def _source(node: Any) -> tuple[Any, list[int] | None]:
    """``(node it copies, permutation)`` following value-keeping ops back from
    ``node``: output dim j is the source's dim ``perm[j]``, None when the dims compose
    to the identity (and ``(None, None)`` when ``node`` is not a copy)."""
    perm: list[int] | None = None
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target is _aten.permute.default:
            dims = list(node.args[1])  # type: ignore[arg-type]
            perm = dims if perm is None else [dims[k] for k in perm]
        elif node.target not in _SAME:
            return None, None
        node = node.args[0]
    return node, None if perm == sorted(perm or []) else perm


def invariant(sub: torch.fx.GraphModule, n_init: int) -> list[int]:
    """The carry positions whose step output is the step's input unchanged."""
    ph = list(sub.graph.find_nodes(op="placeholder"))
    outs: Any = sub.graph.output_node().args[0]
    keep = []
    for i in range(n_init):
        src, perm = _source(outs[i])
        if src is ph[i] and perm is None:
            keep.append(i)
    return keep


def hoist_invariants(fx_tracer: Any, node: torch.fx.Node, out: list[Any], init: list[Any]) -> list:
    """Rewrite the scan ``node`` (its subgraph, its arguments, the ``getitem``s of its
    outputs) so its invariant carries are ``additional_inputs``; returns ``out`` with
    the init value in place of each (the getitems of those outputs are erased)."""
    args: Any = node.args
    sub = getattr(fx_tracer.root, args[0].target)
    init_nodes = list(args[1])
    srcs = {i: _source(init_nodes[i]) for i in invariant(sub, len(init_nodes))}
    # only values read from an input of the graph: inductor's C++ loop frees a
    # temporary handle it makes for an intermediate buffer passed as an additional
    # input after the first step (torch 2.13: a crash), not one for a graph input
    hoisted = [i for i, (s, _) in srcs.items() if s is not None and s.op == "placeholder"]
    n_ys = len(sub.graph.output_node().args[0]) - len(init_nodes)
    # the op needs a carry (an empty one fails), and two outputs (inductor 2.13
    # unwraps a single one once too often when it lowers the op)
    while hoisted and len(init_nodes) - len(hoisted) < max(1, 2 - n_ys):
        hoisted = hoisted[1:]
    users = list(node.users)
    if not hoisted or any(
        u.target is not operator.getitem or not isinstance(u.args[1], int) for u in users
    ):
        return out
    gone = set(hoisted)
    # the subgraph: those placeholders move to the end, their outputs go
    g = sub.graph
    ph = list(g.find_nodes(op="placeholder"))
    last = ph[-1]
    for i in hoisted:
        src, perm = srcs[i]
        with g.inserting_after(last):
            new = g.placeholder(f"hoisted_{i}")
        new.meta["val"] = src.meta["val"]
        value = new
        if perm is not None:  # the carry's layout: a view of the input
            with g.inserting_after(new):  # (after every placeholder: later ones go before)
                value = g.call_function(_aten.permute.default, (new, perm))
            value.meta["val"] = new.meta["val"].permute(perm)
        ph[i].replace_all_uses_with(value)
        g.erase_node(ph[i])
        last = new
    output = g.output_node()
    outs = list(output.args[0])
    output.args = ([v for k, v in enumerate(outs) if k not in gone],)
    g.eliminate_dead_code()
    sub.recompile()
    # the op's arguments and outputs
    node.args = (
        args[0],
        [v for k, v in enumerate(init_nodes) if k not in gone],
        args[2],
        (*tuple(args[3]), *[srcs[i][0] for i in hoisted]),
    )
    vals = node.meta.get("val")
    if isinstance(vals, list | tuple):
        node.meta["val"] = type(vals)(v for k, v in enumerate(vals) if k not in gone)
    shift = [sum(1 for i in hoisted if i < k) for k in range(len(outs))]
    for u in users:
        k: Any = u.args[1]
        if k in gone:
            u.replace_all_uses_with(init_nodes[k])
            fx_tracer.graph.erase_node(u)
        else:
            u.args = (node, k - shift[k])
    return [init[k] if k in gone else v for k, v in enumerate(out)]

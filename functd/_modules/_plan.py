"""Straight-line plans: a Sequential call lowered once per input layout.

A Sequential's reference call (``call_td`` running ``Sequential._step``) walks
its children in a loop, each reading and writing a working dict. The plan of a
(Sequential, layout) pair, where the layout is the td's keys, its number of
batch dims and whether the call takes the hot path (no key, params given), is
that same computation written out as straight-line Python, generated once and
cached on the (frozen) Sequential value: read the inputs once into locals, call
each step's function on plain tensors, build the output TensorDict once. It
keeps the reference's semantics exactly, using the same building blocks:

- outputs that fail the inline check (not a tensor, wrong batch dims, a tuple or
  a mapping for several out_keys) go through ``_outputs._write_outputs``; the
  params of a child go through ``_params_check._check_params``;
- a child that does not declare itself inline (``m._inline()``: a plain Module
  with str keys; not a Probabilistic head, a Sequential kept whole, nested keys)
  runs its own ``_run`` with the call's options on a dict holding exactly the
  entries the reference's working dict holds at that point;
- a layout where some child reads a key nothing provides, or params that are
  not a TensorDict or lack a child's entry, fall back to the reference call,
  which raises its usual error (nothing has run yet when the plan gives up).

Under torch.compile (dynamo) the reference call runs: the traced graph is the
same and the plan cache stays out of the guards. The cache holds at most
``MAX_PLANS`` layouts per Sequential, evicting the least recently used one (a
dict in recency order; a call with the same layout as the last one skips the
bookkeeping), and lives on the Sequential itself, so dropping the module drops
its plans.

No user value becomes source code: keys, param entry names and argument names
are bound in the plan's namespace (``K0 = 'x'``) and reach its body as
keyword-only defaults (fast locals); the source holds only identifiers that
functd made, functd's own literals and plain ints.

Example:
    >>> out = block(params, td)               # first call: builds the plan for td's layout
    >>> ref = reference(block, params, td)    # the reference loop (tests compare the two)
    >>> print(plan_source(block, td))         # the generated code
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F

from .._td import TensorDict, _alloc, _set_bs, _set_data, _set_spec, plain_str
from .._td._marks import mark
from ..nn._linear import Linear
from ..random import fold_in
from ._call import _empty_params, bad_params, call_td
from ._outputs import _write_outputs
from ._params_check import _check_params

__all__ = ["MAX_PLANS", "plan_source", "reference", "run"]

#: Most layouts planned per Sequential; a new layout beyond them evicts the least recently used.
MAX_PLANS = 16

_Tensor = torch.Tensor
#: Functions whose output has the shape of their (tensor) input: the batch-dims
#: check of their output is implied by their input's, which is already checked.
_SHAPE_KEEPING = frozenset(
    {
        torch.relu,
        torch.tanh,
        torch.sigmoid,
        torch.neg,
        torch.exp,
        torch.abs,
        F.relu,
        F.gelu,
        F.silu,
        F.elu,
        F.leaky_relu,
        F.softplus,
        F.mish,
        F.hardtanh,
        F.relu6,
    }
)


def _keeps_shape(fn: Any) -> bool:
    try:
        return fn in _SHAPE_KEEPING
    except TypeError:  # an unhashable callable
        return False


def _early_drops(modules: Any, drop: tuple) -> list[tuple[str, ...]]:
    """Per module: the unselected str keys to delete right after it runs (the last
    module that writes or reads them). Freeing intermediates early keeps the peak
    memory of a selected chain at that of the plain function (and on CPU avoids
    fresh pages for every call). The loop (``Sequential._step``) and the plan both
    use it."""
    last: dict = {}
    for i, m in enumerate(modules):
        for k in (*m.in_keys, *m.out_keys):
            if type(k) is str and k in drop:
                last[k] = i
    out: list[list[str]] = [[] for _ in modules]
    for k, i in last.items():
        out[i].append(k)
    return [tuple(ks) for ks in out]


def _give_up() -> Any:
    """The plan of a layout that the reference call must serve (it raises the error): a
    new function per layout, so that the cache's recency test (``is``) tells them apart."""

    def give_up(params: Any, data: dict, bs: torch.Size, opts: Any) -> None:
        return None

    give_up.gives_up = True  # type: ignore[attr-defined]
    return give_up


#: The most recently used plan of a Sequential that has run none yet.
NO_PLAN = object()


def _check_child(m: Any, p: Any) -> bool:
    """Check a child's params; True when they hold DTensors: the plan then hands the
    call to the loop, whose steps replicate plain inputs onto the params' mesh (the
    steps run so far are pure, so running them again there changes nothing)."""
    if type(p) is not TensorDict:
        bad_params(m, p)
    _check_params(m, p)
    return p._check_cache is not m._fn


def _write1(m: Any, bs: torch.Size, out: Any, key: str) -> Any:
    w: dict = {}
    _write_outputs(m, w, bs, out)
    return w[key]


def _write_n(m: Any, bs: torch.Size, out: Any) -> tuple:
    w: dict = {}
    _write_outputs(m, w, bs, out)
    return tuple(w[k] for k in m.out_keys)


def run(seq: Any, params: Any, td: TensorDict, opts: Any) -> TensorDict | None:
    """``seq(params, td)`` with call options ``opts`` through its plan for td's layout;
    None: the caller runs the reference call (a layout the plan cannot serve, or bad
    params)."""
    data = td._data
    bs = td._batch_size
    key = None if opts is None else opts.key
    layout = (tuple(data), len(bs), key is None and type(params) is TensorDict)
    plans = seq._plans
    plan = plans.get(layout)
    if plan is None:
        plan = _compile(seq, layout)
        while len(plans) >= MAX_PLANS:  # evict the least recently used (the first)
            plans.pop(next(iter(plans), None), None)
    elif plan is not seq._plan_mru:
        plans.pop(layout, None)  # (another thread may have moved it already)
    if plan is not seq._plan_mru:
        plans[layout] = plan  # the most recently used goes last
        object.__setattr__(seq, "_plan_mru", plan)
    return plan(params, data, bs, opts)


def reference(
    seq: Any, params: Any, td: TensorDict, *, key: Any = None, interaction: Any = None
) -> TensorDict:
    """The reference call of ``seq``: its loop over the children, no plan."""
    opts = seq._call_options(key, interaction)
    return call_td(seq, params, td, key, {}, seq._run, opts)


def plan_source(seq: Any, td: TensorDict, *, key: Any = None, params: Any = None) -> str:
    """The Python source of ``seq``'s plan for ``td``'s layout ("" when the reference
    call serves it), followed by comments naming the strings its ``K<n>`` stand for
    (for reading only: the compiled source has no such text)."""
    early = key is None and type(params) is TensorDict
    src, ns = _generate(seq, (tuple(td._data), len(td._batch_size), early))
    names = sorted((k for k in ns if k[:1] == "K" and k[1:].isdigit()), key=lambda k: int(k[1:]))
    return src + "".join(f"# {k} = {ns[k]!r}\n" for k in names)


def _compile(seq: Any, layout: tuple):
    src, ns = _generate(seq, layout)
    if not src:
        return _give_up()
    code = compile(src, f"<functd plan of {seq._label()}>", "exec")
    exec(code, ns)
    return ns["plan"]


def _generate(seq: Any, layout: tuple) -> tuple[str, dict]:
    """(source, globals) of the plan; ("", {}) when the reference call must serve."""
    keys, n, early = layout
    if seq._stateful:
        return "", {}
    drops = _early_drops(seq.modules, seq._drop) if early else None
    ns: dict = {
        "T": _Tensor,
        "TD": TensorDict,
        "_alloc": _alloc,
        "_set_data": _set_data,
        "_set_bs": _set_bs,
        "_set_spec": _set_spec,
        "_mark": mark,
        "_check_child": _check_child,
        "_write1": _write1,
        "_write_n": _write_n,
        "_empty": _empty_params(),
        "F_linear": F.linear,
    }
    lines: list[str] = []
    emit = lines.append
    consts: dict[str, str] = {}  # a user's str (key, param name, argument name) -> its local

    def c(value: str) -> str:
        """The local bound to ``value``: user values live in the namespace, never in the
        source (a key's repr is the user's code; StrEnum members repr as ``<K.X: 'x'>``)."""
        value = plain_str(value)
        name = consts.get(value)
        if name is None:
            name = consts[value] = f"K{len(consts)}"
            ns[name] = value
        return name

    # Static state of the working dict: which keys it holds (in insertion order), which
    # of them sit in the dict ``base`` (the td's entries, or the dict an opaque child
    # last ran on), and the local variable holding each key's latest value.
    order: list[str] = list(keys)  # the reference dict's keys, in its order
    live = set(keys)
    in_base = set(keys)
    var: dict[str, str] = {}  # key -> local holding its value
    dirty: set[str] = set()  # keys whose value is in a local but not in base
    base_is_data = True
    counter = [0]

    def fresh() -> str:
        counter[0] += 1
        return f"v{counter[0]}"

    def read(k: str) -> str:
        if k not in var:
            v = fresh()
            emit(f"    {v} = base[{c(k)}]")
            var[k] = v
        return var[k]

    def working_dict(name: str) -> None:
        """Emit ``name`` = a dict equal to the reference's working dict at this point."""
        live_order = [k for k in order if k in live]
        if base_is_data:  # one dict display, in the reference dict's key order
            body = ", ".join(f"{c(k)}: {var.get(k, f'base[{c(k)}]')}" for k in live_order)
            emit(f"    {name} = {{{body}}}")
            return
        emit(f"    {name} = base")  # a dict of ours (made for an opaque child): reused
        for k in live_order:
            if k in dirty:
                emit(f"    {name}[{c(k)}] = {var[k]}")
        for k in sorted(in_base - live):
            emit(f"    del {name}[{c(k)}]")

    steps = seq._steps
    has_p = [s[2] for s in steps]
    if seq._nparams < sys.maxsize:  # params with an entry no child owns: the loop raises
        emit(f"    if type(params) is TD and len(params._data) > {int(seq._nparams)}:")
        emit("        return None")
    if any(has_p):
        emit("    if type(params) is not TD:")
        emit("        return None")
        emit("    pd = params._data")
        emit("    try:")
        for j, ((name, *_), hp) in enumerate(zip(steps, has_p)):
            if hp:
                emit(f"        p{j} = pd[{c(name)}]")
        emit("    except KeyError:")
        emit("        return None")
    emit("    base = data")
    if seq._random:
        ns["fold_in"] = fold_in
        emit("    key = None if opts is None else opts.key")
    for i, (_name, m, hp, rnd, idx, run) in enumerate(steps):
        ns[f"M{i}"] = m
        p = f"p{i}" if hp else "None"
        if m._inline():
            if any(k not in live for k in m.in_keys):
                return "", {}  # the reference call raises the missing-input error
            args = [read(k) for k in m.in_keys]
            kw = ""
            if rnd:
                emit(f"    k{i} = None if key is None else fold_in(key, {int(idx)})")
                kw = f", key=k{i}"
            kind = m._kind
            if kind == 2:
                ns[f"F{i}"] = m._plain
                call = f"F{i}({', '.join(args)})"
            elif kind == 0:
                ns[f"F{i}"] = m._fn
                emit(f"    if type({p}) is not TD or {p}._check_cache is not F{i}:")
                emit(f"        if _check_child(M{i}, {p}):")
                emit("            return None")
                call = f"F{i}({', '.join([p, *args])}{kw})"
                if type(m._fn).__call__ is Linear.__call__ and len(args) == 1:
                    # Linear.__call__'s body, written out (tests compare it with the loop);
                    # its DTensor branch is not needed here: DTensor params are marked
                    # Placed, fail the `_checked is F` test above and take the loop
                    call = f"F_linear({args[0]}, {p}._data['weight'], {p}._data.get('bias'))"
            elif kind == 1:
                ns[f"F{i}"] = m._fn
                call = f"F{i}({', '.join(['_empty', *args])}{kw})"
            else:
                ns[f"F{i}"] = m._fn
                kws = ", ".join(f"{c(a)}: {v}" for a, v in zip(m._kwargs, args))
                call = f"F{i}(**{{{kws}}})"
            outs = m.out_keys
            vs = [fresh() for _ in outs]
            if len(outs) == 1:
                o, v = outs[0], vs[0]
                emit(f"    {v} = {call}")
                if kind == 2 and len(args) == 1 and _keeps_shape(m._plain):
                    cond = f"type({v}) is not T"  # same shape as its checked input
                elif kind == 0 and type(m._fn) is Linear and len(args) == 1:
                    # (..., in) -> (..., out): the batch dims stay when the input has a
                    # feature dim beyond them
                    cond = (
                        f"type({v}) is not T or {args[0]}.ndim == {n}"
                        if n
                        else (f"type({v}) is not T")
                    )
                elif n == 0:
                    cond = f"type({v}) is not T"
                elif n == 1:  # one dim compared: cheaper than slicing the shape
                    cond = f"type({v}) is not T or not {v}.ndim or {v}.shape[0] != bs[0]"
                else:
                    cond = f"type({v}) is not T or {v}.shape[:{n}] != bs"
                emit(f"    if {cond}:")
                emit(f"        {v} = _write1(M{i}, bs, {v}, {c(o)})")
            else:
                emit(f"    {', '.join(vs)}, = _write_n(M{i}, bs, {call})")
            for o, v in zip(outs, vs):
                if o not in order:
                    order.append(o)
                live.add(o)
                var[o] = v
                dirty.add(o)
        else:
            working_dict("d")
            d = "d"
            o = (
                f"opts if key is None else opts.with_key(fold_in(key, {int(idx)}))"
                if rnd
                else "opts"
            )
            ns[f"R{i}"] = run  # the step the loop runs for this child
            emit(f"    R{i}({p}, {d}, bs, {o})")
            emit(f"    base = {d}")
            base_is_data = False
            for o in getattr(m, "_drop", ()):  # what a Sequential child removes
                if type(o) is str and o in live:
                    live.discard(o)
                    order.remove(o)  # written again later, it goes to the end
            for o in m.out_keys:
                top = o if type(o) is str else o[0]
                if top not in order:
                    order.append(top)
                live.add(top)
            in_base = set(live)
            var.clear()
            dirty.clear()
        if drops is not None:
            for k in drops[i]:
                if k in live:
                    live.discard(k)
                    if k in var:
                        emit(f"    del {var.pop(k)}")  # free the intermediate now
                    dirty.discard(k)
    for k in seq._drop:
        if type(k) is str and k in live:
            live.discard(k)
            dirty.discard(k)
            var.pop(k, None)
    working_dict("out")
    if any(type(k) is not str for k in seq._drop):
        ns["SEQ"] = seq  # only then: no reference cycle module -> plan -> module otherwise
        emit("    SEQ._drop_unselected(out)")
    emit("    td = _alloc(TD)")  # _new without its dynamo check: plans run eagerly only
    emit("    _set_data(td, out)")
    emit("    _set_bs(td, bs)")
    emit("    _set_spec(td, None)")
    emit("    _mark(td, None)")
    emit("    return td")
    # the user's strings reach the body as keyword-only defaults: fast locals, bound from ns
    bound = "".join(f", {n}={n}" for n in consts.values())
    head = f"def plan(params, data, bs, opts{', *' if bound else ''}{bound}):\n"
    return head + "\n".join(lines) + "\n", ns

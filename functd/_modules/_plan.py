"""Straight-line plans: a Sequential call lowered once per input layout.

A Sequential's reference call (``ModuleKind.run_td`` running ``SequenceKind.run``)
walks its children in a loop, each reading and writing a working dict. The plan of a
(Sequential, layout) pair, where the layout is the td's keys, its number of
batch dims and whether the call takes the hot path (no key, params given), is
that same computation written out as straight-line Python, generated once and
cached on the (frozen) Sequential value: read the inputs once into locals, call
each step's function on plain tensors, build the output TensorDict once. It
keeps the reference's semantics exactly, using the same building blocks:

- a child that describes its step (``describe()``: a ``_step.Step`` that
  ``_step.inlinable`` accepts) is written out from that description alone: its
  reads, its call in the description's form, its params check and its writes.
  Outputs that fail the inline check (not a tensor, wrong batch dims, a tuple or
  a mapping for several out_keys) go through ``_outputs._write_outputs``, the
  params through ``_params_check._check_params``, as in ``_step.run_step``;
- any other child (a Probabilistic head, a Sequential kept whole, nested keys,
  state) runs its own step (``SequenceKind.child_step``) with the call options on a dict holding exactly
  the entries the reference's working dict holds at that point;
- a layout where some child reads a key nothing provides, or params that are
  not a TensorDict or lack a child's entry, fall back to the reference call,
  which raises its usual error (nothing has run yet when the plan gives up).

Under torch.compile (dynamo) the reference call runs: the traced graph is the
same and the plan cache stays out of the guards. The cache holds at most
``MAX_PLANS`` layouts per Sequential, evicting the least recently used one (a
dict in recency order; a call with the same layout as the last one skips the
bookkeeping), and lives on the Sequential itself, so dropping the module drops
its plans. The source is registered with ``linecache`` under the plan's file
name for as long as the plan lives, so a traceback through a plan shows its lines.
An error that a child's call raises is named as ``_step.run_step`` names it
(``_raised.py``: the module, its inputs, its position): the plan's line where it
raised tells the child (``in_plan``), at no cost until something raises.

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

import itertools
import linecache
import weakref
from typing import Any, cast

import torch

from .._td import (
    EMPTY,
    TensorDict,
    is_dynamo_compiling,
    new_unchecked,
    plain_str,
)
from ..random import fold_in
from ._call import ModuleKind, bad_params
from ._outputs import _write_outputs
from ._params_check import _check_params
from ._raised import CAUGHT, in_module, in_sequence
from ._step import Form, Step, inlinable

__all__ = ["MAX_PLANS", "call", "layout_key", "plan_source", "reference"]

#: Most layouts planned per Sequential; a new layout beyond them evicts the least recently used.
MAX_PLANS = 16

_Tensor = torch.Tensor
_numbers = itertools.count()


def layout_key(params: Any, td: TensorDict, opts: Any) -> tuple:
    """The layout a plan is made for: the td's keys in order, its number of batch dims
    and whether the call takes the hot path (no key, params given)."""
    return (
        tuple(td._data),
        len(td._batch_size),
        (opts is None or opts.key is None) and type(params) is TensorDict,
    )


def _early_drops(modules: Any, drop: tuple) -> list[tuple[str, ...]]:
    """Per module: the unselected str keys to delete right after it runs (the last
    module that writes or reads them). Freeing intermediates early keeps the peak
    memory of a selected chain at that of the plain function (and on CPU avoids
    fresh pages for every call). The loop (``SequenceKind.run``) and the plan both
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
    return p._check_cache is not m.describe().token


def _write1(m: Any, bs: torch.Size, out: Any, key: str) -> Any:
    w: dict = {}
    _write_outputs(m, w, bs, out)
    return w[key]


def _write_n(m: Any, bs: torch.Size, out: Any) -> tuple:
    w: dict = {}
    _write_outputs(m, w, bs, out)
    return tuple(w[k] for k in m.out_keys)


def call(seq: Any, params: Any, td: TensorDict, opts: Any) -> TensorDict:
    """``seq(params, td)`` with call options ``opts`` (``SequenceKind.run_td``): the plan
    of td's layout; the reference call (the loop) under dynamo, and where the plan gives
    up (a layout it cannot serve, or bad params: the loop raises the error)."""
    if is_dynamo_compiling():
        return ModuleKind.run_td(seq, params, td, opts)
    layout = layout_key(params, td, opts)
    plans = seq._plans
    plan = plans.get(layout)
    if plan is not None and plan is seq._plan_mru:  # the last call's layout: no bookkeeping
        try:
            out = plan(params, td._data, td._batch_size, opts)
        except CAUGHT as e:  # (free until raised) naming the child that raised
            new = in_plan(seq, plan, e)
            if new is None:
                raise
            raise new from e
        return out if out is not None else ModuleKind.run_td(seq, params, td, opts)
    if plan is None:
        plan = _compile(seq, layout)
        while len(plans) >= MAX_PLANS:  # evict the least recently used (the first)
            plans.pop(next(iter(plans), None), None)
    elif plan is not seq._plan_mru:
        plans.pop(layout, None)  # (another thread may have moved it already)
    if plan is not seq._plan_mru:
        plans[layout] = plan  # the most recently used goes last
        object.__setattr__(seq, "_plan_mru", plan)
    try:
        out = plan(params, td._data, td._batch_size, opts)
    except CAUGHT as e:
        new = in_plan(seq, plan, e)
        if new is None:
            raise
        raise new from e
    return out if out is not None else ModuleKind.run_td(seq, params, td, opts)


def reference(
    seq: Any, params: Any, td: TensorDict, *, key: Any = None, interaction: Any = None
) -> TensorDict:
    """The reference call of ``seq``: its loop over the children, no plan."""
    opts = seq.call_options(key, **({} if interaction is None else {"interaction": interaction}))
    return ModuleKind.run_td(seq, params, td, opts)


def plan_source(seq: Any, td: TensorDict, *, key: Any = None, params: Any = None) -> str:
    """The Python source of ``seq``'s plan for ``td``'s layout ("" when the reference
    call serves it), followed by comments naming the strings its ``K<n>`` stand for
    (for reading only: the compiled source has no such text)."""
    opts = seq.call_options(key)
    src, ns = _generate(seq, layout_key(params, td, opts))
    names = sorted((k for k in ns if k[:1] == "K" and k[1:].isdigit()), key=lambda k: int(k[1:]))
    return src + "".join(f"# {k} = {ns[k]!r}\n" for k in names)


def _compile(seq: Any, layout: tuple):
    src, ns = _generate(seq, layout)
    if not src:
        return _give_up()
    filename = f"<functd plan {next(_numbers)} of {seq._label()}>"
    exec(compile(src, filename, "exec"), ns)
    plan = ns["plan"]
    plan.sites = ns.pop("SITES")  # (in_plan reads them)
    # the source, for tracebacks and inspect, for as long as the plan lives
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    weakref.finalize(plan, linecache.cache.pop, filename, None)
    return plan


def _generate(seq: Any, layout: tuple) -> tuple[str, dict]:
    """(source, globals) of the plan; ("", {}) when the reference call must serve."""
    if seq._stateful:
        return "", {}
    w = _Writer(layout)
    w.params(seq)
    drops = _early_drops(seq.modules, seq._drop) if w.early else None
    for i, c in enumerate(seq._child_steps):
        m = c.module
        w.ns[f"M{i}"] = m
        p = f"p{i}" if c.has_params else "None"
        position = c.position if c.random else None
        desc = m.describe()
        if desc is not None and inlinable(desc):
            if not w.inline(i, desc, p, position):
                return "", {}  # a read nothing provides: the reference call raises
        else:
            w.opaque(i, m, p, c.step, position)
        if drops is not None:
            w.drop_early(drops[i])
    return w.finish(seq)


class _Writer:
    """The plan's lines, its namespace, and the static state of the reference's working
    dict: its keys in insertion order (``order``), which are ``live``, which sit in the
    dict ``base`` (the td's entries, or the dict an opaque child last ran on), and the
    local variable holding each key's latest value (``var``; ``dirty``: not in base)."""

    def __init__(self, layout: tuple) -> None:
        keys, self.n, self.early = layout
        self.ns: dict = {"T": _Tensor, "TD": TensorDict, "_write1": _write1}
        self.lines: list[str] = []
        self.consts: dict[str, str] = {}  # a user's str (key, name) -> its local
        self.order, self.live, self.in_base = list(keys), set(keys), set(keys)
        self.var: dict[str, str] = {}
        self.dirty: set[str] = set()
        self.base_is_data = True
        self.count = 0
        # plan line -> (child, its input locals, its params local): where each child's
        # call is, for the error of a call that raises (``in_plan``)
        self.sites: dict[int, tuple[int, list[str] | None, str | None]] = {}
        self.ns["SITES"] = self.sites
        self.deep: set[str] = set()  # locals known to have a dim beyond the batch dims

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def site(self, i: int, args: list[str] | None, p: str) -> None:
        """The line just emitted calls child ``i`` (``args``: its input locals; None:
        the child runs its own step)."""
        self.sites[len(self.lines) + 1] = (i, args, p if p.startswith("p") else None)

    def c(self, value: str) -> str:
        """The local bound to ``value``: user values live in the namespace, never in the
        source (a key's repr is the user's code; StrEnum members repr as ``<K.X: 'x'>``)."""
        value = plain_str(value)
        name = self.consts.get(value)
        if name is None:
            name = self.consts[value] = f"K{len(self.consts)}"
            self.ns[name] = value
        return name

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def read(self, k: str) -> str:
        if k not in self.var:
            v = self.var[k] = self.fresh()
            self.emit(f"{v} = base[{self.c(k)}]")
        return self.var[k]

    def params(self, seq: Any) -> None:
        """The params preamble: give up (to the loop, which raises) on params with an
        entry no child owns, not a TensorDict, or lacking a child's entry."""
        n = seq._n_param_entries  # (not None: params with more entries go to the loop)
        named = [(j, c.name) for j, c in enumerate(seq._child_steps) if c.has_params]
        if named:
            self.emit("if type(params) is not TD:")
            self.emit("    return None")
            self.emit("pd = params._data")
            if n is not None:
                self.emit(f"if len(pd) > {int(n)}:")
                self.emit("    return None")
            self.emit("try:")
            for j, name in named:
                self.emit(f"    p{j} = pd[{self.c(name)}]")
            self.emit("except KeyError:")
            self.emit("    return None")
        elif n is not None:  # params with an entry no child owns: the loop raises
            self.emit(f"if type(params) is TD and len(params._data) > {int(n)}:")
            self.emit("    return None")
        self.emit("base = data")
        if seq._random:
            self.ns["fold_in"] = fold_in
            self.emit("key = None if opts is None else opts.key")

    def inline(self, i: int, s: Step, p: str, idx: int | None) -> bool:
        """Write out child ``i`` from its description ``s``; False: a read is missing."""
        reads = cast(tuple[str, ...], s.reads)  # (inlinable: str keys)
        if any(k not in self.live for k in reads):
            return False
        args = [self.read(k) for k in reads]
        f = f"F{i}"
        self.ns[f] = s.fn
        if s.token is not None:  # the params check (once per params: _td/_marks.py)
            self.ns[f"C{i}"] = s.token
            self.emit(f"if type({p}) is not TD or {p}._check_cache is not C{i}:")
            self.emit(f"    if _check_child(M{i}, {p}):")
            self.emit("        return None")
            self.ns["_check_child"] = _check_child
        if s.inline is not None and s.inline.keeps_lead and self.n and args[0] not in self.deep:
            # an input without a dim beyond the batch dims: the loop serves it (its
            # output checks); past this test the output keeps the batch dims by shape
            self.emit(f"if {args[0]}.ndim == {self.n}:")
            self.emit("    return None")
            self.deep.add(args[0])
        call = self.call(i, s, p, args, idx)
        outs = cast(tuple[str, ...], s.writes)
        vs = [self.fresh() for _ in outs]
        if len(outs) == 1:
            self.emit(f"{vs[0]} = {call}")
            self.site(i, args, p)
            self.emit(f"if {self.bad_output(vs[0], s, args)}:")
            self.emit(f"    {vs[0]} = _write1(M{i}, bs, {vs[0]}, {self.c(outs[0])})")
            if (s.same_shape or (s.inline is not None and s.inline.keeps_lead)) and (
                args and args[0] in self.deep
            ):
                self.deep.add(vs[0])  # (the output check keeps a tensor of that shape)
        else:
            self.ns["_write_n"] = _write_n
            self.emit(f"{', '.join(vs)}, = _write_n(M{i}, bs, {call})")
            self.site(i, args, p)
        for o, v in zip(outs, vs):
            if o not in self.order:
                self.order.append(o)
            self.live.add(o)
            self.var[o] = v
            self.dirty.add(o)
        return True

    def call(self, i: int, s: Step, p: str, args: list[str], idx: int | None) -> str:
        """The call expression of ``s`` in its form (``_step.call``'s forms)."""
        f = f"F{i}"
        if s.form is Form.PLAIN:
            return f"{f}({', '.join(args)})"
        if s.form is Form.KEYWORDS:
            kws = ", ".join(f"{self.c(a)}: {v}" for a, v in zip(s.names, args))  # type: ignore[arg-type]
            return f"{f}(**{{{kws}}})"
        if s.form is Form.EMPTY:
            self.ns["_empty"] = EMPTY
            p = "_empty"
        if s.inline is not None:  # the layer's call written out (nn._base.Inline)
            self.ns.update(s.inline.names)
            return s.inline.expr.format(p=p, x=args[0])
        kw = ""
        if s.key:
            k = "key"
            if idx is not None:
                self.emit(f"k{i} = None if key is None else fold_in(key, {int(idx)})")
                k = f"k{i}"
            kw = f", key={k}"
        return f"{f}({', '.join([p, *args])}{kw})"

    def bad_output(self, v: str, s: Step, args: list[str]) -> str:
        """The test that sends output ``v`` to ``_write_outputs`` (its checks, its error)."""
        n = self.n
        if s.same_shape or n == 0:  # same shape as its checked input / no batch dims
            return f"type({v}) is not T"
        if s.inline is not None and s.inline.keeps_lead:
            # (..., in) -> (..., out): the batch dims stay, the input having a dim beyond
            # them (tested once per input where it is read: ``inline``)
            return f"type({v}) is not T"
        if n == 1:  # one dim compared: cheaper than slicing the shape
            return f"type({v}) is not T or not {v}.ndim or {v}.shape[0] != bs[0]"
        return f"type({v}) is not T or {v}.shape[:{n}] != bs"

    def working_dict(self, name: str) -> None:
        """Emit ``name`` = a dict equal to the reference's working dict at this point."""
        live_order = [k for k in self.order if k in self.live]
        if self.base_is_data:  # one dict display, in the reference dict's key order
            body = ", ".join(
                f"{self.c(k)}: {self.var.get(k, f'base[{self.c(k)}]')}" for k in live_order
            )
            self.emit(f"{name} = {{{body}}}")
            return
        self.emit(f"{name} = base")  # a dict of ours (made for an opaque child): reused
        for k in live_order:
            if k in self.dirty:
                self.emit(f"{name}[{self.c(k)}] = {self.var[k]}")
        for k in sorted(self.in_base - self.live):
            self.emit(f"del {name}[{self.c(k)}]")

    def opaque(self, i: int, m: Any, p: str, step: Any, idx: int | None) -> None:
        """Child ``i`` runs its own step on a dict equal to the loop's working dict."""
        self.working_dict("d")
        o = (
            "opts"
            if idx is None
            else f"opts if key is None else opts.with_key(fold_in(key, {int(idx)}))"
        )
        self.ns[f"R{i}"] = step  # the step the loop runs for this child
        self.emit(f"R{i}({p}, d, bs, {o})")
        self.site(i, None, p)
        self.emit("base = d")
        self.base_is_data = False
        for k in getattr(m, "_drop", ()):  # what a Sequential child removes
            if type(k) is str and k in self.live:
                self.live.discard(k)
                self.order.remove(k)  # written again later, it goes to the end
        for k in m.out_keys:
            top = k if type(k) is str else k[0]
            if top not in self.order:
                self.order.append(top)
            self.live.add(top)
        self.in_base = set(self.live)
        self.var.clear()
        self.dirty.clear()

    def drop_early(self, keys: tuple) -> None:
        for k in keys:
            if k in self.live:
                self.live.discard(k)
                if k in self.var:
                    self.emit(f"del {self.var.pop(k)}")  # free the intermediate now
                self.dirty.discard(k)

    def finish(self, seq: Any) -> tuple[str, dict]:
        """Drop the unselected keys, build the output TensorDict; (source, namespace)."""
        for k in seq._drop:
            if type(k) is str and k in self.live:
                self.live.discard(k)
                self.dirty.discard(k)
                self.var.pop(k, None)
        self.working_dict("out")
        if any(type(k) is not str for k in seq._drop):
            self.ns["SEQ"] = seq  # only then: no reference cycle module -> plan -> module
            self.emit("SEQ._drop_unselected(out)")
        self.ns["_new"] = new_unchecked  # from_parts without its dynamo test: plans run eagerly
        self.emit("return _new(out, bs)")
        # the user's strings reach the body as keyword-only defaults: fast locals, bound from ns
        bound = "".join(f", {n}={n}" for n in self.consts.values())
        head = f"def plan(params, data, bs, opts{', *' if bound else ''}{bound}):\n"
        return head + "\n".join(self.lines) + "\n", self.ns


_WRITERS = (_write1.__code__, _write_n.__code__)


def in_plan(seq: Any, plan: Any, e: BaseException) -> BaseException | None:
    """The error to raise (``from e``) for ``e``, raised by ``seq``'s ``plan``: a child's
    call that raised (found by the plan's line in the traceback) named as the step
    names it (``_raised.in_module``), with its position; None: re-raise ``e``."""
    sites, tb = getattr(plan, "sites", None), e.__traceback__
    while tb is not None and tb.tb_frame.f_code is not getattr(plan, "__code__", None):
        tb = tb.tb_next
    site = None if tb is None or not sites else sites.get(tb.tb_lineno)
    if site is None:
        return None  # raised outside a child's call (its params check, its outputs')
    i, argv, pv = site
    child = seq._child_steps[i]
    nxt = tb.tb_next  # type: ignore[union-attr]
    new = None
    if argv is not None and (nxt is None or nxt.tb_frame.f_code not in _WRITERS):
        local = tb.tb_frame.f_locals  # type: ignore[union-attr]
        args = [local.get(v) for v in argv]
        new = in_module(child.module, e, args, None if pv is None else local.get(pv))
    in_sequence(seq, child.name, e if new is None else new)
    return new

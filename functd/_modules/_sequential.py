"""Sequential: composition of modules, ``a >> b >> c``.

Each module reads the entries written by the ones before it; every entry is
kept unless outputs are selected, and the input keys always stay. Parameters
nest by position (``params["0", "weight"]``); a module without parameters
contributes nothing. Nested Sequentials flatten, so composition is associative,
and Sequentials compare and hash by value.

Example:
    >>> block = fd.Sequential(lin, act, add)          # or lin >> act >> add
    >>> params = block.init(fd.random.key(0))
    >>> out = block(params, td)                       # new td with every entry
    >>> y = block.select_out_keys("y")(params, x=x)   # one tensor
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .. import _errors as E
from .._td import Key, TensorDict, from_parts
from ..random import fold_in
from . import _plan
from ._call import ModuleKind, Options, params_hint
from ._keys import as_keys
from ._plan import _early_drops
from ._raised import CAUGHT, in_sequence

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__ = ["Child", "HotStep", "SequenceKind", "Sequential"]


class Child(NamedTuple):
    """One position of a sequence, as the child loop and the plan read it: the params
    entry ``name``, the ``module``, its traits, its ``position`` (the key of a random
    child is ``fold_in(key, position)``) and the ``step`` the sequence runs for it
    (``SequenceKind.child_step``)."""

    name: str
    module: ModuleKind
    has_params: bool
    random: bool
    position: int
    step: Any


class HotStep(NamedTuple):
    """One position on the loop's hot path (default options, params given): the params
    entry (None: the child has none), the step, the keys to delete after it."""

    param_name: str | None
    step: Any
    drop_after: tuple[str, ...]


def _flatten(modules: Sequence[Any]) -> list[ModuleKind]:
    flat: list = []
    for i, m in enumerate(modules):
        spliced = m.spliced_children() if isinstance(m, ModuleKind) else None
        if spliced is not None:
            flat.extend(c for _, c in spliced)
        elif isinstance(m, ModuleKind):
            flat.append(m)
        else:
            raise TypeError(
                f"Sequential: argument {i} is a {type(m).__name__}; Sequential chains modules "
                "(fd.Module, fd.Sequential, fd.Probabilistic, ...). Wrap functions and torch "
                "modules with fd.Module(fn, in_keys=[...], out_keys=[...])."
            )
    return flat


class SequenceKind(ModuleKind):
    """What every sequence kind shares (``fd.Sequential``, ``fd.ProbabilisticSequential``):
    children run in turn on one working dict (the one child loop, ``run_children``),
    params nest by position, outputs may be selected. A td call runs the plan of the
    td's layout (``run_td``: ``_plan.call``); ``child_step(m)`` is the step the
    sequence runs for child ``m`` (its ``run``; a probabilistic sequence draws its
    heads' one sample).

    Attributes:
        modules: the flattened tuple of modules.
        in_keys: keys read before any module writes them.
        out_keys: keys written (or the selected ones), in order of first write.

    Raises:
        TypeError: an argument is not a module.
        KeyError: a selected key is written by no module.
    """

    __slots__ = (
        "_all_out",
        "_child_steps",
        "_drop",
        "_hot_steps",
        "_n_param_entries",
        "_param_names",
        "_plan_mru",
        "_plans",
        "_random",
        "_stateful",
        "in_keys",
        "modules",
        "names",
        "out_keys",
        "selected_out_keys",
    )
    _all_out: tuple[Key, ...]
    _child_steps: tuple[Child, ...]
    _drop: tuple[Key, ...]
    _hot_steps: tuple[HotStep, ...]
    _n_param_entries: int | None  # the most params entries a call takes; None: unchecked
    _param_names: frozenset[str] | None
    _plan_mru: Any
    _plans: dict
    _random: bool
    _stateful: bool
    in_keys: Any
    modules: Any
    names: Any
    out_keys: Any
    selected_out_keys: Any

    def __init__(
        self,
        *modules: ModuleKind,
        selected_out_keys: Sequence[Key] | None = None,
        _names: Sequence[str] | None = None,
    ) -> None:
        if len(modules) == 1 and isinstance(modules[0], list | tuple):
            modules = tuple(modules[0])
        if not modules:
            raise ValueError("Sequential needs at least one module.")
        flat = tuple(_flatten(modules))
        names = tuple(_names) if _names is not None else tuple(str(i) for i in range(len(flat)))
        ins: list = []
        outs: list = []
        for m in flat:
            ins.extend(k for k in m.in_keys if k not in outs and k not in ins)
            outs.extend(k for k in m.out_keys if k not in outs)
        sel = None
        if selected_out_keys is not None:
            sel = as_keys(list(selected_out_keys), "selected_out_keys")
            bad = [k for k in sel if k not in outs]
            if bad:
                raise KeyError(
                    f"Sequential.select_out_keys: no module writes {E.fmt_keys(bad)}; "
                    f"the modules write: {E.fmt_keys(outs)}."
                )
        set_ = object.__setattr__
        set_(self, "modules", flat)
        set_(self, "names", names)
        set_(self, "selected_out_keys", sel)
        set_(self, "in_keys", tuple(ins))
        set_(self, "_all_out", tuple(outs))
        set_(self, "out_keys", sel if sel is not None else tuple(outs))
        set_(
            self,
            "_drop",
            tuple(k for k in outs if sel is not None and k not in sel and k not in ins),
        )
        set_(self, "_random", any(m.random for m in flat))
        steps = [self.child_step(m) for m in flat]
        set_(
            self,
            "_child_steps",
            tuple(
                Child(n, m, m.has_params, m.random, int(n), r)
                for n, m, r in zip(names, flat, steps)
            ),
        )
        early = _early_drops(flat, self._drop)
        set_(
            self,
            "_hot_steps",
            tuple(
                HotStep(n if m.has_params else None, r, d)
                for n, m, r, d in zip(names, flat, steps, early)
            ),
        )
        set_(self, "_stateful", any(m.stateful for m in flat))
        set_(self, "_plans", {})  # layout -> straight-line plan (_plan.py), LRU-bounded
        set_(self, "_plan_mru", _plan.NO_PLAN)  # the plan of the last call (_plan.call)
        # the params entries a call accepts: its own children's, or (a slice, given
        # `_names`) unchecked until _takes_params_of names the whole model's
        own = frozenset(n for n, m in zip(names, flat) if m.has_params)
        self._set_param_names(own if _names is None else None)

    def child_step(self, m: ModuleKind) -> Any:
        """The step this sequence runs for child ``m``: its ``run``."""
        return m.run

    def _set_param_names(self, names: frozenset[str] | None) -> None:
        """The params entries a call accepts (None: not checked)."""
        object.__setattr__(self, "_param_names", names)
        object.__setattr__(self, "_n_param_entries", None if names is None else len(names))

    def _takes_params_of(self, other: SequenceKind) -> SequenceKind:
        """Accept the params entries ``other`` accepts (a slice takes the whole
        model's params); returns ``self``."""
        self._set_param_names(other._param_names)
        return self

    # ---------------------------------------------------------------- value
    @property
    def has_params(self) -> bool:
        return any(m.has_params for m in self.modules)

    @property
    def random(self) -> bool:
        """True when a call needs a PRNG ``key`` (some module is random)."""
        return self._random

    @property
    def stateful(self) -> bool:
        """True when some module computes new running statistics (BatchNorm in
        training mode): call with ``apply_with_state``; a plain call raises."""
        return self._stateful

    def _identity(self) -> tuple:
        return (self.modules, self.names, self.selected_out_keys)

    # ---------------------------------------------------------------- protocol
    def children(self) -> tuple[tuple[str, ModuleKind], ...]:
        return tuple(zip(self.names, self.modules))

    def _rebuild(self, modules: Sequence[ModuleKind], selected: Any, names: Any) -> SequenceKind:
        """The same kind over other modules (a subclass adds its own arguments)."""
        return type(self)(*modules, selected_out_keys=selected, _names=names)

    def with_children(self, children: Sequence[ModuleKind]) -> SequenceKind:
        if len(children) != len(self.modules):
            raise ValueError(
                f"{self._label()}.with_children: {len(children)} children for "
                f"{len(self.modules)} positions."
            )
        new = self._rebuild(children, self.selected_out_keys, self.names)
        return new._takes_params_of(self)  # the same params entries are accepted

    def spliced_children(self) -> tuple[tuple[str, ModuleKind], ...] | None:
        """A Sequential without a selection is spliced into the one that holds it."""
        return self.children() if self.selected_out_keys is None else None

    def __len__(self) -> int:
        return len(self.modules)

    def __iter__(self) -> Iterator[ModuleKind]:
        return iter(self.modules)

    def __getitem__(self, index: int | slice) -> SequenceKind:
        """A Sequential of the chosen module(s) whose params layout matches: it takes
        the full params (the entries keep their names)."""
        if isinstance(index, slice):
            return self._part(self.modules[index], self.names[index])
        return self._part((self.modules[index],), (self.names[index],))

    def _part(self, mods: Sequence[ModuleKind], names: Sequence[str]) -> SequenceKind:
        """The one rule for a part of this sequence (a slice, ``select_subsequence``): a
        plain Sequential of ``mods`` (a probabilistic kind has its own rule) that takes
        this sequence's params."""
        return Sequential(*mods, _names=names)._takes_params_of(self)

    def __rshift__(self, other: Any) -> Sequential:
        return Sequential(self, other)

    def __repr__(self) -> str:
        body = ",\n".join(f"  {n}: {m!r}" for n, m in zip(self.names, self.modules))
        sel = (
            f",\n  selected_out_keys={list(self.selected_out_keys)}"
            if self.selected_out_keys
            else ""
        )
        return f"Sequential(\n{body}{sel})"

    def select_out_keys(self, *keys: Key) -> Self:
        """A new Sequential that keeps only ``keys`` of the outputs (the inputs stay).

        Raises:
            KeyError: a key is written by no module.
        """
        new = self._rebuild(self.modules, keys, self.names)._takes_params_of(self)
        return new  # type: ignore[return-value]  # _rebuild builds a type(self)

    def select_subsequence(
        self, in_keys: Sequence[Key] | None = None, out_keys: Sequence[Key] | None = None
    ) -> Sequential:
        """A new Sequential of the modules that can run from ``in_keys`` and that
        ``out_keys`` need (tensordict's ``select_subsequence``); ``self`` is unchanged.

        Two filters, in this order: a module is kept if each of its inputs is in
        ``in_keys`` or written by a module kept before it; then, of those, a module
        is kept if it writes one of ``out_keys`` or an input of a module kept after
        it. A nested (selected) Sequential is filtered the same way. The modules
        keep their names, so the new Sequential takes the same params. As in
        tensordict, the result selects no outputs (``select_out_keys`` again).

        Args:
            in_keys: the keys to start from (default: ``self.in_keys``).
            out_keys: the keys to compute (default: ``self.out_keys``).

        Raises:
            ValueError: no module is left.

        Example:
            >>> seq = fd.Sequential(a_to_b, b_to_c, c_to_d, a_to_e)
            >>> seq.select_subsequence(out_keys=["c"]).out_keys
            ('b', 'c')
        """
        ins = list(self.in_keys if in_keys is None else as_keys(list(in_keys), "in_keys"))
        outs = list(self.out_keys if out_keys is None else as_keys(list(out_keys), "out_keys"))
        mods = list(self.modules)
        keep = set(range(len(mods)))
        for i, m in enumerate(mods):
            if isinstance(m, SequenceKind):
                try:
                    m = mods[i] = _nested_subsequence(m, in_keys=list(ins))
                except ValueError:
                    keep.discard(i)
                    continue
            if all(k in ins for k in m.in_keys):
                ins.extend(m.out_keys)
            else:
                keep.discard(i)
        for i in reversed(range(len(mods))):
            if i not in keep:
                continue
            m = mods[i]
            if any(k in outs for k in m.out_keys):
                if isinstance(m, SequenceKind):
                    m = mods[i] = _nested_subsequence(m, out_keys=list(outs))
                outs.extend(m.in_keys)
            else:
                keep.discard(i)
        if not keep:
            raise ValueError(
                f"{self._label()}.select_subsequence: no module is left; make sure that in_keys "
                "and out_keys are coherent (a module is kept when it can run from in_keys and "
                "some out_key needs it)."
            )
        idx = sorted(keep)
        return self._part([mods[i] for i in idx], [self.names[i] for i in idx])  # type: ignore[return-value]

    # ---------------------------------------------------------------- params
    def init(self, key: Any, dtype: torch.dtype = torch.float32, device: Any = None) -> TensorDict:
        """Fresh parameters nested by position; module ``i`` gets ``fold_in(key, i)``."""
        return super().init(key, dtype=dtype, device=device)

    # ---------------------------------------------------------------- call
    # __call__: ModuleKind's. A td call runs the plan of the td's layout, or the loop
    # (``run``) under dynamo and where no plan serves: see functd/_modules/_plan.py.
    run_td = _plan.call

    def apply_with_state(
        self, params: TensorDict | None, td: TensorDict, /, *, key: Any = None
    ) -> tuple[TensorDict, TensorDict]:
        """``seq(params, td)`` that also returns the new running statistics.

        Returns:
            ``(out, new_state)``: the new statistics of the stateful modules
            nested by position like ``params`` (``new_state["1", "running_mean"]``);
            empty when there are none. Apply with ``fd.nn.update_state``.

        Example:
            >>> out, new_state = seq.apply_with_state(params, td)
            >>> params = fd.nn.update_state(params, new_state)
        """
        return super().apply_with_state(params, td, key=key)

    def run_children(
        self,
        params: Any,
        data: dict,
        bs: torch.Size,
        opts: Options | None,
        stop: int | None = None,
        visit: Any = None,
    ) -> dict:
        """The child loop: run the children in turn on the working dict (child ``i`` gets
        ``fold_in(key, i)`` when random), checking their params; returns the new
        running statistics they return, by name. ``stop``: before that position;
        ``visit(i, child, data, opts)`` is asked first and True skips the child."""
        pdata = params._data if type(params) is TensorDict else None
        key = None if opts is None else opts.key
        states = {}
        for i, (name, m, has_p, rnd, position, step) in enumerate(self._child_steps):
            if i == stop:
                break
            p = self._child_params(params, pdata, name, m) if has_p else None
            o = opts.with_key(fold_in(key, position)) if rnd and key is not None else opts  # type: ignore[union-attr]
            if visit is not None and visit(i, m, data, o):
                continue
            try:
                s = step(p, data, bs, o)
            except CAUGHT as e:  # (free until raised) the position of a module's error
                in_sequence(self, name, e)
                raise
            if s is not None:
                states[name] = s
        return states

    def _label(self) -> str:
        return f"{type(self).__name__}({len(self.modules)} modules -> {E.fmt_keys(self.out_keys)})"

    def run(
        self, params: TensorDict | None, data: dict, bs: torch.Size, opts: Options | None
    ) -> TensorDict | None:
        """The child loop on the working dict ``data``, then the unselected outputs
        dropped; the children's new running statistics by name (``opts.collect``)."""
        if self._stateful and (opts is None or not opts.collect):
            self._state_dropped()
        pdata = params._data if type(params) is TensorDict else None
        n = self._n_param_entries
        if pdata is not None and n is not None and len(pdata) > n:
            self._extra_params(params)  # type: ignore[arg-type]
        if opts is None and pdata is not None:
            try:  # the hot path: default options, params given
                for name, step, drop in self._hot_steps:
                    step(None if name is None else pdata[name], data, bs, None)
                    if drop:  # intermediates no later module reads: free them now
                        for k in drop:
                            del data[k]
            except KeyError:
                for c in self._child_steps:
                    if c.has_params and c.name not in pdata:
                        self._bad_params(params, c.name, c.module)
                raise
            except CAUGHT as e:  # (free until raised) the position of a module's error
                in_sequence(self, next(c.name for c in self._child_steps if c.step is step), e)
                raise
            self._drop_unselected(data)
            return None
        states = self.run_children(params, data, bs, opts)
        self._drop_unselected(data)
        return from_parts(states, torch.Size([])) if states or self._stateful else None

    def _state_dropped(self):
        """A plain call of a sequence with a stateful child: the error naming the child."""
        name, m = next((n, m) for n, m in self.children() if m.stateful)
        what = f"module {name} ({m._label()})"
        raise RuntimeError(E.STATE_DROPPED.format(label=self._label(), what=what))

    def _child_params(self, params: Any, pdata: dict | None, name: str, m: Any) -> TensorDict:
        """The params of child ``name`` (which has some); a clear error when absent."""
        p = pdata.get(name) if pdata is not None else None
        if p is None:
            self._bad_params(params, name, m)
        n = self._n_param_entries
        if n is not None and len(pdata) > n:  # type: ignore[arg-type]
            self._extra_params(params)
        return p  # type: ignore[return-value]

    def _drop_unselected(self, data: dict) -> None:
        for k in self._drop:
            if type(k) is str:
                data.pop(k, None)
            elif type(data.get(k[0])) is TensorDict:
                data[k[0]] = data[k[0]].exclude(k[1:])

    def _extra_params(self, params: TensorDict):
        """Params with entries no module of this Sequential (or of the model it was
        sliced from) owns: the same KeyError a Module gives for unexpected entries."""
        names = self._param_names or frozenset()
        extra = [k for k in params._data if k not in names]
        if not extra:
            return
        raise KeyError(
            f"{self._label()}: params have unexpected entr{'y' if len(extra) == 1 else 'ies'} "
            f"{E.fmt_keys(extra)}: no module with parameters is named so (they are "
            f"{E.fmt_keys(sorted(names, key=_by_position))}). Were these params made for "
            f"another module? Use {params_hint(self, 'seq')}."
        )

    def _bad_params(self, params: Any, name: str, m: Any):
        if type(params) is not TensorDict:
            what = "nothing" if params is None else f"a {type(params).__name__}"
            raise TypeError(
                f"{self._label()} has parameters but was given {what} as params. Call "
                f"seq(params, td) with params = {params_hint(self, 'seq')}."
            )
        raise KeyError(
            f"{self._label()}: params lack entry {name!r} for module {name} ({m._label()}); "
            f"params have: {E.fmt_keys(params.keys())}. Were they made for another module? "
            f"Use {params_hint(self, 'seq')}."
        )


class Sequential(SequenceKind):
    """Compose modules; ``selected_out_keys`` keeps only those outputs (plus the inputs).

    Attributes:
        modules: the flattened tuple of modules.
        in_keys: keys read before any module writes them.
        out_keys: keys written (or the selected ones), in order of first write.

    Raises:
        TypeError: an argument is not a module (``fd.Module``, ``fd.Sequential``, ...).
        KeyError: a selected key is written by no module.
    """

    __slots__ = ()
    _FROZEN_HINT = "select_out_keys(...) and indexing return new Sequentials."


def _by_position(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _nested_subsequence(m: SequenceKind, **keys: Any) -> SequenceKind:
    """``m.select_subsequence(**keys)`` for a nested Sequential (one that selects its
    outputs, else it would have been flattened): its selection is kept where its
    outputs remain, so it stays one nested child."""
    sub = m.select_subsequence(**keys)
    sel = m.selected_out_keys
    if sel is None:
        return sub
    kept = [k for k in sel if k in sub._all_out]
    return sub._rebuild(sub.modules, kept, sub.names)._takes_params_of(m)

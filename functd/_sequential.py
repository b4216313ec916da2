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
from typing import Any

import torch

from . import _errors as E
from . import _plan
from ._module import COLLECT, STATE, Module, apply_with_state, as_keys, call_td
from ._td import Key, TensorDict, _is_dynamo, _new

__all__ = ["Sequential"]


def _early_drops(modules: Sequence[Any], drop: tuple) -> list[tuple[str, ...]]:
    """Per module: the unselected str keys to delete right after it runs (the last
    module that writes or reads them). Freeing intermediates early keeps the peak
    memory of a selected chain at that of the plain function (and on CPU avoids
    fresh pages for every call)."""
    last: dict = {}
    for i, m in enumerate(modules):
        for k in (*m.in_keys, *m.out_keys):
            if type(k) is str and k in drop:
                last[k] = i
    out: list[list[str]] = [[] for _ in modules]
    for k, i in last.items():
        out[i].append(k)
    return [tuple(ks) for ks in out]


def _flatten(modules: Sequence[Any]) -> list[Module | Sequential]:
    flat: list = []
    for i, m in enumerate(modules):
        if isinstance(m, Sequential) and m.selected_out_keys is None:
            flat.extend(m.modules)
        elif isinstance(m, Module | Sequential):
            flat.append(m)
        else:
            raise TypeError(
                f"Sequential: argument {i} is a {type(m).__name__}; Sequential chains fd.Module "
                "and fd.Sequential. Wrap functions and torch modules with "
                "fd.Module(fn, in_keys=[...], out_keys=[...])."
            )
    return flat


class Sequential:
    """Compose modules; ``selected_out_keys`` keeps only those outputs (plus the inputs).

    Attributes:
        modules: the flattened tuple of modules.
        in_keys: keys read before any module writes them.
        out_keys: keys written (or the selected ones), in order of first write.

    Raises:
        TypeError: an argument is not a Module or Sequential.
        KeyError: a selected key is written by no module.
    """

    __slots__ = (
        "_all_out",
        "_drop",
        "_plain",
        "_plans",
        "_random",
        "_run",
        "_stateful",
        "_steps",
        "in_keys",
        "modules",
        "names",
        "out_keys",
        "selected_out_keys",
    )

    def __init__(
        self,
        *modules: Module | Sequential,
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
        steps = tuple((n, m, m.has_params, m.random, int(n), m._run) for n, m in zip(names, flat))
        set_(self, "_steps", steps)
        early = _early_drops(flat, self._drop)
        set_(
            self,
            "_plain",
            tuple((n if m.has_params else None, m._run, d) for n, m, d in zip(names, flat, early)),
        )
        set_(self, "_stateful", any(getattr(m, "stateful", False) for m in flat))
        set_(self, "_plans", {})  # layout -> straight-line plan (_plan.py), bounded
        set_(self, "_run", self._stateful_step if self._stateful else self._step)

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

    def __eq__(self, other: object) -> bool:
        return type(other) is Sequential and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __setattr__(self, name: str, value: Any) -> None:
        raise E.FrozenError(
            f"Sequential is immutable: cannot set {name!r}. select_out_keys(...) and "
            "indexing return new Sequentials."
        )

    def __len__(self) -> int:
        return len(self.modules)

    def __iter__(self) -> Iterator[Module | Sequential]:
        return iter(self.modules)

    def __getitem__(self, index: int | slice) -> Sequential:
        """A Sequential of the chosen module(s) whose params layout matches: it takes
        the full params (the entries keep their names)."""
        if isinstance(index, slice):
            mods, names = self.modules[index], self.names[index]
        else:
            mods, names = (self.modules[index],), (self.names[index],)
        return Sequential(*mods, _names=names)

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

    def select_out_keys(self, *keys: Key) -> Sequential:
        """A new Sequential that keeps only ``keys`` of the outputs (the inputs stay).

        Raises:
            KeyError: a key is written by no module.
        """
        return Sequential(*self.modules, selected_out_keys=keys, _names=self.names)

    # ---------------------------------------------------------------- params
    def init(self, key: Any, dtype: torch.dtype = torch.float32, device: Any = None) -> TensorDict:
        """Fresh parameters nested by position; module ``i`` gets ``fold_in(key, i)``."""
        from .nn import as_key
        from .random import fold_in

        key = as_key(key)
        data = {}
        for name, m, has_p, _, idx, _ in self._steps:
            if has_p:
                data[name] = m.init(fold_in(key, idx), dtype=dtype, device=device)
        return _new(data, torch.Size([]))

    # ---------------------------------------------------------------- call
    def __call__(
        self,
        params: TensorDict | None = None,
        td: TensorDict | None = None,
        /,
        *,
        key: Any = None,
        **tensors: torch.Tensor,
    ):
        """``seq(params, td)`` -> new td; ``seq(params, x=x)`` -> tensor(s) of ``out_keys``."""
        if type(td) is TensorDict and not tensors and not _is_dynamo():
            data, bs = td._data, td._batch_size  # the plan of td's layout (_plan.run, inlined)
            plan = self._plans.get(
                (tuple(data), len(bs), key is None and type(params) is TensorDict)
            )
            out = (
                plan(params, data, bs, key, None)
                if plan is not None
                else _plan.run(self, params, td, key)
            )
            if out is not None:
                return out
        return call_td(self, params, td, key, tensors, self._run)

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
        return apply_with_state(self, params, td, key)

    def _stateful_step(self, params: Any, data: dict, bs: torch.Size, key: Any) -> None:
        """``_step`` that collects the children's new state under their names."""
        collect = data.pop(STATE, None) is COLLECT
        states = self._each_child(params, data, bs, key, collect)
        self._drop_unselected(data)
        if collect:
            data[STATE] = _new(states, torch.Size([]))

    def _each_child(
        self, params: Any, data: dict, bs: torch.Size, key: Any, collect: bool | None = None
    ) -> dict:
        """Run the children in turn on the general path (keys, missing params, and,
        when ``collect`` is not None, the new state of stateful children by name)."""
        pdata = params._data if type(params) is TensorDict else None
        states = {}
        for name, m, has_p, rnd, idx, run in self._steps:
            p = self._child_params(params, pdata, name, m) if has_p else None
            if rnd and key is not None:
                from .random import fold_in

                k = fold_in(key, idx)
            else:
                k = key
            if collect is not None and getattr(m, "stateful", False):
                if not collect:
                    what = f"module {name} ({m._label()})"
                    raise RuntimeError(E.STATE_DROPPED.format(label=self._label(), what=what))
                data[STATE] = COLLECT
                run(p, data, bs, k)
                states[name] = data.pop(STATE)
            else:
                run(p, data, bs, k)
        return states

    def _label(self) -> str:
        return f"Sequential({len(self.modules)} modules -> {E.fmt_keys(self.out_keys)})"

    def _step(self, params: TensorDict | None, data: dict, bs: torch.Size, key: Any) -> None:
        pdata = params._data if type(params) is TensorDict else None
        if key is None and pdata is not None:
            try:  # the hot path: no key, params given
                for name, run, drop in self._plain:
                    run(None if name is None else pdata[name], data, bs, None)
                    if drop:  # intermediates no later module reads: free them now
                        for k in drop:
                            del data[k]
            except KeyError:
                for name, m, has_p, *_ in self._steps:
                    if has_p and name not in pdata:
                        self._bad_params(params, name, m)
                raise
            self._drop_unselected(data)
            return
        self._each_child(params, data, bs, key)
        self._drop_unselected(data)

    def _child_params(self, params: Any, pdata: dict | None, name: str, m: Any) -> TensorDict:
        """The params of child ``name`` (which has some); a clear error when absent."""
        p = pdata.get(name) if pdata is not None else None
        if p is None:
            self._bad_params(params, name, m)
        return p

    def _drop_unselected(self, data: dict) -> None:
        for k in self._drop:
            if type(k) is str:
                data.pop(k, None)
            elif type(data.get(k[0])) is TensorDict:
                data[k[0]] = data[k[0]].exclude(k[1:])

    def _bad_params(self, params: Any, name: str, m: Any):
        if type(params) is not TensorDict:
            what = "nothing" if params is None else f"a {type(params).__name__}"
            raise TypeError(
                f"{self._label()} has parameters but was given {what} as params. Call "
                "seq(params, td) with params = seq.init(fd.random.key(0)) or fd.from_module(seq)."
            )
        raise KeyError(
            f"{self._label()}: params lack entry {name!r} for module {name} ({m._label()}); "
            f"params have: {E.fmt_keys(params.keys())}. Were they made for another module? "
            "Use seq.init(key) or fd.from_module(seq)."
        )

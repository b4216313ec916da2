"""The calling protocol every module kind implements (their frozen base: ``functd._frozen``).

A module kind (``fd.Module``, ``fd.Sequential``, ``fd.Probabilistic``,
``fd.ProbabilisticSequential``, or one of your own) is a frozen, hashable value
that subclasses ``ModuleKind``. Its call, ``m(params, td, key=...)``, is
``ModuleKind.__call__`` for every kind: it turns the positional and keyword forms
into a td call and checks the arguments. What differs between kinds goes through
these methods, and only these:

- ``run(params, data, batch_size, opts)``: **the step**, on the working ``dict``
  ``data`` (the entries of the td being built), given the call options ``opts``
  (an ``Options``: the PRNG key, the interaction type, whether new running
  statistics are collected; ``None`` means all defaults). It writes its outputs
  into ``data`` and returns its new running statistics when ``opts.collect`` asks
  for them (else None). Every kind implements it; a parent runs its children's.
- ``run_td(params, td, opts)``: one call on a TensorDict: by default ``run`` on a
  working copy of td's entries, which becomes the new td. A sequence runs the
  plan of td's layout instead (``_plan.call``); a probabilistic kind with
  ``num_samples`` vmaps its one-sample step over split keys.
- ``call_options(key, ...)``: the call's ``Options`` from ``key=`` and the
  kind's ``option_names`` keywords (``interaction=`` for the probabilistic
  kinds), checked; None for the defaults.
- ``children()``: its named sub-modules (``()`` for a leaf), and
  ``with_children(new)``: the same kind rebuilt around new children;
  ``spliced_children()``: the children a Sequential splices in its place (a
  Sequential without a selection), or None;
- ``describe()``: the ``_step.Step`` a Sequential's plan may write out, or None;
- ``with_training(training)``: its own mode switch (``fd.nn.eval_mode`` calls it,
  as it calls a layer's); the default rebuilds the children switched;
- ``own_buffer_paths()``, ``own_held_paths()`` and ``torch_source()``: the
  running statistics, held-out params and torch module it holds itself
  (``buffer_paths()`` adds the children's, for ``fd.nn.split_state``;
  ``fd.trainable``, ``fd.from_module``);
- traits: ``has_params``, ``random``, ``stateful`` (from the children by
  default), ``probabilistic`` (a class attribute: it draws from a distribution).

Two families add their own: a sequence (``_sequential.SequenceKind``) has
``run_children(...)``, the one child loop, and ``child_step(m)``, the step it runs
for child ``m`` (``m.run``; a probabilistic sequence draws its heads); a
probabilistic kind (``_probabilistic.ProbabilisticKind``) has ``draw(...)``, its
one-sample step, which its ``run`` refuses to stand for under ``num_samples``.

Everything generic (``fd.nn.eval_mode``, ``split_state``, ``from_module``, a
Sequential's child loop, ``apply_with_state``, the keyword and positional call
forms) goes through these methods only: no isinstance ladder over the kinds.

Example:
    >>> class Twice(ModuleKind):            # a user-defined kind with one child
    ...     __slots__ = ("inner", "in_keys", "out_keys")
    ...     def __init__(self, inner):
    ...         object.__setattr__(self, "inner", inner)
    ...         object.__setattr__(self, "in_keys", inner.in_keys)
    ...         object.__setattr__(self, "out_keys", inner.out_keys)
    ...     def _identity(self): return (self.inner,)
    ...     def children(self): return (("inner", self.inner),)
    ...     def with_children(self, new): return Twice(*new)
    ...     def run(self, params, data, bs, opts):  # the child's step, twice
    ...         p = params["inner"] if self.inner.has_params else None
    ...         self.inner.run(p, data, bs, opts)
    ...         return self.inner.run(p, data, bs, opts)
    >>> twice = Twice(fd.Module(lambda x: x + 1, ["x"], ["x"]))
    >>> twice(None, x=torch.zeros(2))
    tensor([2., 2.])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch

from .. import _errors as E
from .._frozen import Frozen
from .._td import Key, TensorDict, from_parts
from ..random import as_key, fold_in
from ._keys import key_diff

__all__ = ["ModuleKind", "Options", "call_forms", "positional_call"]

_NOPE = object()
_Tensor = torch.Tensor


class Options:
    """The options of one call, handed to every ``run``: ``key`` (a PRNG key or
    None), ``interaction`` (an ``fd.InteractionType`` or None: only the
    probabilistic kinds read it), ``collect`` (True under ``apply_with_state``:
    stateful steps return their new running statistics)."""

    __slots__ = ("collect", "interaction", "key")
    collect: Any
    interaction: Any
    key: Any

    def __init__(self, key: Any = None, interaction: Any = None, collect: bool = False) -> None:
        self.key, self.interaction, self.collect = key, interaction, collect

    def with_key(self, key: Any) -> Options:
        """The same options with another key (a child's ``fold_in(key, i)``)."""
        return Options(key, self.interaction, self.collect)

    def __repr__(self) -> str:
        return (
            f"Options(key={self.key!r}, interaction={self.interaction!r}, collect={self.collect})"
        )


def options(key: Any = None, interaction: Any = None, collect: bool = False) -> Options | None:
    """``Options(...)``, or None (the defaults) when every field is unset."""
    if key is None and interaction is None and not collect:
        return None
    return Options(key, interaction, collect)


Path = tuple[str, ...]


class ModuleKind(Frozen):
    """The calling protocol (see the module docstring). A subclass sets ``in_keys``
    and ``out_keys`` and implements ``_identity`` and ``run``; the rest has defaults
    for a kind that holds children and no parameters of its own."""

    __slots__ = ()
    in_keys: tuple[Key, ...]
    out_keys: tuple[Key, ...]

    # ------------------------------------------------------------ structure
    def children(self) -> tuple[tuple[str, ModuleKind], ...]:
        """``((name, child), ...)``: the sub-modules, whose params nest under ``name``."""
        return ()

    def with_children(self, children: Sequence[ModuleKind]) -> ModuleKind:
        """The same kind around ``children`` (in the order of ``children()``)."""
        if children:
            raise TypeError(f"{self._label()} has no children to replace.")
        return self

    def with_training(self, training: bool) -> ModuleKind:
        """The same module in training (``training=True``) or eval mode (``self`` when
        unchanged); the default switches the children."""
        kids = self.children()
        new = [c.with_training(training) for _, c in kids]
        if all(a is b for a, (_, b) in zip(new, kids)):
            return self
        return self.with_children(new)

    def own_buffer_paths(self) -> tuple[Path, ...]:
        """Paths (in this kind's own params) of the running statistics it holds itself."""
        return ()

    def buffer_paths(self) -> tuple[Path, ...]:
        """Paths (in this module's params) of every running statistic: its own and its
        children's, nested under their names (``fd.nn.buffer_paths`` calls it)."""
        return self.own_buffer_paths() + tuple(
            (name, *path)
            for name, child in self.children()
            if child.has_params
            for path in child.buffer_paths()
        )

    def own_held_paths(self) -> tuple[Path, ...]:
        """Paths (in this kind's own params) that torch would not train: its running
        statistics and other buffers, and frozen parameters (``fd.trainable``)."""
        return self.own_buffer_paths()

    def torch_source(self) -> torch.nn.Module | None:
        """The torch module whose weights this kind holds itself, if any."""
        return None

    def describe(self) -> Any:
        """The description of this kind's step (``_step.Step``) that a Sequential's plan
        may write out, or None: the plan runs the kind's own step (``run``) whole."""
        return None

    def spliced_children(self) -> tuple[tuple[str, ModuleKind], ...] | None:
        """The children a Sequential splices in place of this module (a Sequential
        without a selection), or None: it stays one child."""
        return None

    # ------------------------------------------------------------ traits
    #: True for a kind that draws from a distribution (``fd.Probabilistic``,
    #: ``fd.ProbabilisticSequential``): a sub-sequence ending in one stays probabilistic.
    probabilistic: bool = False

    @property
    def has_params(self) -> bool:
        return any(c.has_params for _, c in self.children())

    @property
    def random(self) -> bool:
        """True when a call needs a PRNG ``key``."""
        return any(c.random for _, c in self.children())

    @property
    def stateful(self) -> bool:
        """True when a call computes new running statistics (``apply_with_state``)."""
        return any(c.stateful for _, c in self.children())

    def _label(self) -> str:
        return f"{type(self).__name__}(-> {E.fmt_keys(self.out_keys)})"

    # ------------------------------------------------------------ params
    def init(self, key: Any, dtype: torch.dtype = torch.float32, device: Any = None) -> TensorDict:
        """Fresh parameters nested by child name; child ``name`` gets
        ``fold_in(key, i)`` (``i = int(name)`` for a position, else its index)."""
        key = as_key(key)
        data = {}
        for i, (name, c) in enumerate(self.children()):
            if c.has_params:
                idx = int(name) if name.isdigit() else i
                data[name] = c.init(fold_in(key, idx), dtype=dtype, device=device)
        return from_parts(data, torch.Size([]))

    # ------------------------------------------------------------ call
    #: The call keywords besides ``key=`` that are options of this kind, not tensors
    #: (``("interaction",)`` for the probabilistic kinds); ``call_options`` takes them.
    option_names: tuple[str, ...] = ()

    def run(self, params: Any, data: dict, bs: torch.Size, opts: Options | None) -> Any:
        """The step on the working dict ``data``: a hook of the calling protocol, which
        a parent calls for its children (see functd/_modules/_call.py); to call a
        module, call it: ``m(params, td)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement run")

    def run_td(self, params: Any, td: TensorDict, opts: Options | None) -> TensorDict:
        """One call on ``td`` (a protocol hook, behind ``m(params, td)``): ``run`` on a
        working copy of its entries, which becomes the new td."""
        data = dict(td._data)
        self.run(params, data, td._batch_size, opts)
        return from_parts(data, td._batch_size)

    def call_options(self, key: Any = None) -> Options | None:
        """The options of a call with ``key=``: None for the defaults. A kind with
        ``option_names`` takes them as further keywords, and checks them."""
        return None if key is None else Options(key)

    @overload  # m(params, td[, key=, interaction=]): a TensorDict
    def __call__(
        self, params: TensorDict | None, td: TensorDict, /, *, key: Any = None, **options: Any
    ) -> TensorDict: ...
    @overload  # m(params, x, h) or m(params, x=x): the out tensor(s)
    def __call__(
        self,
        params: TensorDict | None = None,
        td: torch.Tensor | None = None,
        /,
        *args: torch.Tensor,
        key: Any = None,
        **tensors: Any,
    ) -> Any: ...

    def __call__(
        self,
        params: TensorDict | None = None,
        td: TensorDict | torch.Tensor | None = None,
        /,
        *args: torch.Tensor,
        key: Any = None,
        **tensors: Any,
    ) -> Any:  # a TensorDict for a td call; the out tensor(s) for a tensor call
        """``m(params, td)`` -> new td; or ``m(params, x=x)`` -> tensor(s) of ``out_keys``.

        ``m(params, x, h)``: tensors in ``in_keys`` order (tensordict's positional
        dispatch, after the params), the rest by keyword; returns the out tensors.
        The probabilistic kinds also take ``interaction=`` (their ``option_names``).
        """
        if type(td) is TensorDict and not args and not tensors:  # m(params, td[, key=])
            return self.run_td(params, td, None if key is None else Options(key))
        return call_forms(self, params, td, args, key, tensors)

    def apply_with_state(
        self, params: TensorDict | None, td: TensorDict, /, *, key: Any = None
    ) -> tuple[TensorDict, TensorDict]:
        """``m(params, td)`` that also returns the new running statistics.

        Returns:
            ``(out, new_state)``: ``new_state`` holds the new statistics of the
            stateful layers (BatchNorm in training mode), laid out like their
            entries in ``params`` (empty when there are none). Apply them with
            ``fd.nn.update_state(params, new_state)``. Nothing is written.

        Example:
            >>> bn = fd.Module(nn.BatchNorm1d(3), in_keys=["x"], out_keys=["y"])
            >>> params = fd.from_module(bn)
            >>> out, new_state = bn.apply_with_state(params, td)
            >>> params = fd.nn.update_state(params, new_state)
        """
        return apply_with_state(self, params, td, Options(key, None, True))


# ---------------------------------------------------------------- the call forms
def call_forms(m: Any, params: Any, td: Any, args: tuple, key: Any, tensors: dict) -> Any:
    """``m(...)`` other than ``m(params, td[, key=])``: the kind's option keywords
    (``interaction=``), the positional form ``m(params, x, h)``, the keyword form
    ``m(params, x=x)`` and the argument errors; a td call ends in ``m.run_td``."""
    call_kw = None
    if tensors and m.option_names:
        for name in m.option_names:
            if name in tensors:
                if call_kw is None:
                    call_kw = {}
                call_kw[name] = tensors.pop(name)
    typ = type(td)
    if args or (td is not None and typ is not TensorDict and isinstance(td, _Tensor)):
        return positional_call(m, params, (td, *args), key, tensors, call_kw)
    opts = None if call_kw is None else m.call_options(key, **call_kw)  # checked first
    if td is None:
        _option_names(m, call_kw)
        return keyword_call(m, params, key, tensors, call_kw)
    if tensors:
        raise TypeError(f"{m._label()}: pass either a TensorDict or keyword tensors, not both.")
    if typ is not TensorDict and not isinstance(td, TensorDict):
        bad_td(m, params, td)
    return m.run_td(params, td, m.call_options(key) if call_kw is None else opts)


def apply_with_state(m: Any, params: Any, td: Any, opts: Options) -> tuple[TensorDict, TensorDict]:
    """``m(params, td)`` returning ``(out, new_state)``; ``opts.collect`` is True."""
    if not isinstance(td, TensorDict):
        bad_td(m, params, td)
    data = dict(td._data)
    state = m.run(params, data, td._batch_size, opts)
    if state is None:
        state = from_parts({}, torch.Size([]))
    return from_parts(data, td._batch_size), state


def _option_names(m: Any, call_kw: dict | None) -> None:
    """The keyword form cannot tell an in_key named like a call option (``key``,
    ``interaction``) from the option: refuse it, with the two forms that can."""
    options = {"key", *(call_kw or ())}
    clash = [k for k in m.in_keys if _kwarg_name(k) in options]
    if clash:
        name = _kwarg_name(clash[0])
        raise TypeError(
            f"{m._label()} reads the entry {E.fmt_key(clash[0])}, whose keyword {name}= is also "
            f"the call option {name}= (the PRNG key{'' if name == 'key' else ' / option'}), so "
            f"the keyword form m(params, {name}=...) is ambiguous. Pass a TensorDict, "
            f"m(params, fd.TensorDict({{{name!r}: tensor, ...}})), or the tensors positionally "
            f"in in_keys order, m(params, *tensors, key=prng_key)."
        )


def _kwarg_name(key: Key) -> str:
    return key if isinstance(key, str) else "_".join(key)


def keyword_call(m: Any, params: Any, key: Any, tensors: dict, call_kw: dict | None = None):
    """``m(params, x=x)``: build the td from keyword tensors, return the out tensors.
    ``call_kw``: the kind's own call keywords, passed back unread (``interaction=``)."""
    if not tensors:
        if isinstance(params, TensorDict):
            raise TypeError(
                f"{m._label()} takes (params, td); got one TensorDict. Call m(params, td); a "
                "module without parameters takes m(None, td)."
            )
        hint = ""
        if isinstance(params, _Tensor):
            hint = " The params come first: m(None, x) for a module without parameters."
        raise TypeError(
            f"{m._label()} takes (params, td), (params, *tensors) or (params, **tensors); "
            f"got no data.{hint}"
        )
    names = {_kwarg_name(k): k for k in m.in_keys}
    missing, unknown = key_diff(names, tensors)
    if unknown or missing:
        raise TypeError(
            f"{m._label()}: keyword call got unknown name(s) {unknown or '(none)'} and lacks "
            f"{missing or '(none)'}; it takes {list(names)}."
        )
    td = TensorDict({}, [])
    for n, v in tensors.items():
        td = td.set(names[n], v)
    out = m(params, td, key=key, **(call_kw or {}))
    vals = tuple(out.get(k) for k in m.out_keys)
    return vals[0] if len(vals) == 1 else vals


def positional_call(
    m: Any, params: Any, args: tuple, key: Any, tensors: dict, call_kw: dict | None = None
):
    """``m(params, x, h)``: tensors in ``m.in_keys`` order after the params (tensordict's
    positional dispatch), the remaining in_keys by keyword; returns the out tensors."""
    ins = m.in_keys
    if isinstance(args[0], TensorDict):
        raise TypeError(
            f"{m._label()}: m(params, td) takes no further positional arguments; got "
            f"{len(args) - 1} more. Call m(params, td) or m(params, *tensors)."
        )
    if len(args) > len(ins):
        raise TypeError(
            f"{m._label()}: got {len(args)} positional tensors but in_keys has {len(ins)} "
            f"({E.fmt_keys(ins)}); pass one tensor per in_key, in this order."
        )
    named = {}
    for k, v in zip(ins, args):
        name = _kwarg_name(k)
        if not isinstance(v, _Tensor):
            raise TypeError(
                f"{m._label()}: positional input {E.fmt_key(k)} is a {type(v).__name__}, not a "
                "tensor. Call m(params, td) with a TensorDict, or m(params, *tensors)."
            )
        if name in tensors:
            raise TypeError(
                f"{m._label()}: {E.fmt_key(k)} is given both positionally and as {name}=."
            )
        named[name] = v
    named.update(tensors)
    return keyword_call(m, params, key, named, call_kw)


# ---------------------------------------------------------------- shared errors
def get_path(data: dict, key: tuple) -> Any:
    """The entry at a nested ``key`` of a working dict, or ``_NOPE``."""
    v = data.get(key[0], _NOPE)
    for part in key[1:]:
        if type(v) is not TensorDict:
            return _NOPE
        v = v._data.get(part, _NOPE)
    return v


def missing_input(m: Any, key: Key, data: dict):
    out = []  # type: ignore[var-annotated]
    for k, v in data.items():
        if type(v) is TensorDict:
            out.extend((k, *(sk if isinstance(sk, tuple) else (sk,))) for sk in v.keys(True, True))
        else:
            out.append(k)
    raise KeyError(
        f"{m._label()} reads {E.fmt_key(key)}, which the tensordict lacks; it has: "
        f"{E.fmt_keys(out)}"
    )


def bad_td(m: Any, params: Any, td: Any):
    if isinstance(params, TensorDict) and td is None:
        raise TypeError(f"{m._label()} takes (params, td); got one TensorDict.")
    raise TypeError(
        f"{m._label()}: the second argument must be a TensorDict, got {type(td).__name__}. "
        "Call m(params, td) or m(params, x=tensor)."
    )


def bad_params(m: Any, params: Any):
    what = "nothing" if params is None else f"a {type(params).__name__}"
    raise TypeError(
        f"{m._label()} has parameters but was given {what} as params. Call "
        f"m(params, td) with params = {params_hint(m)}."
    )


def params_hint(m: Any, name: str = "m") -> str:
    """Where ``m``'s params come from, for error messages: ``fd.from_module(m)`` when it
    wraps torch modules (their weights; ``init`` raises for a module functd runs
    through ``FunctionalCall``), ``m.init(key)`` for fresh weights when it can."""
    wraps, inits = param_sources(m)
    ways = []
    if wraps:
        ways.append(f"fd.from_module({name}) (the weights of the torch modules it wraps)")
    if inits:
        ways.append(f"{name}.init(fd.random.key(0)) (fresh weights)")
    return " or ".join(ways) or f"fd.from_module({name})"


def param_sources(m: Any) -> tuple[bool, bool]:
    """(wraps a torch module, every layer can ``init``) over ``m`` and its children."""
    kids = m.children()
    if kids:
        parts = [param_sources(c) for _, c in kids if c.has_params]
        return any(w for w, _ in parts), all(i for _, i in parts)
    fn = getattr(m, "fn", None)
    try:
        if fn is not None and hasattr(fn, "_specs"):
            fn._specs()
        inits = True
    except NotImplementedError:  # FunctionalCall (or a Chain holding one): no pure init
        inits = False
    return m.torch_source() is not None, inits

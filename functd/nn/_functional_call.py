"""``FunctionalCall``: any ``nn.Module`` run as a pure layer.

The layer holds a private copy of the module on the ``meta`` device (no real
tensors). A call puts the given params into the copy's parameter and buffer
slots, runs its ``forward`` and puts the meta tensors back, so nothing of the
call stays behind. On plain eager calls the swap is a dict write per slot
(``torch.func.functional_call`` re-walks the module tree on every call, which
costs more than the model on small networks); under ``torch.compile`` the
call is ``torch.func.functional_call``, which dynamo knows.

In training mode the forward runs inside ``KeyedRandom`` (``_keyed.py``): every
random function it calls draws from the call's ``key=``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import threading
from itertools import chain
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import torch
from torch import Tensor, nn

from .._eager import is_wrapped
from .._td import TensorDict
from .._td._dtensor import is_dtensor
from ._base import Layer, set_derived
from ._convert import flat_state
from ._draws import may_draw
from ._fsdp import fsdp_meta_copy
from ._keyed import GLOBAL_DRAW, KeyedRandom, generator_state, restore_state, same_state
from ._written import (
    UNDECLARED,
    OutCopies,
    WriteWatch,
    plain_tensor_attrs,
    state_buffers,
    versions,
    written,
)

__all__ = ["FunctionalCall", "meta_copy"]

NO_INIT = (
    "FunctionalCall({name}).init(key): only lowered layers have a pure `init`; {name} could "
    "not be lowered onto one (see functd.nn.lower). Take the module's current weights "
    "instead: `params = fd.from_module(module)` (functd.nn.state_to_td(module)), or "
    "re-initialise the torch module itself and read them again."
)


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionalCall(Layer):
    """Run any ``nn.Module`` as a pure layer.

    Holds a private copy of the module on the ``meta`` device (no real
    tensors; made without copying the weights), so the user's module is
    never used nor mutated. A call runs the copy's ``forward`` with
    ``params`` (dotted ``state_dict`` names, every parameter and buffer) and
    the inputs. Buffers are cloned first, so a forward that writes into them
    writes into a temporary: the caller's TensorDict (and the module it came
    from) are unchanged. When the module writes buffers that are state
    (``stateful``: BatchNorm or spectral_norm in training mode, or the buffers
    named in ``state``), the call returns ``(out, new_state)``: those buffers
    after the call (see ``functd.nn.update_state``). A write to any other
    buffer (in place or ``self.buf = ...``) raises after the call, naming it: it
    is never dropped silently. The weight of an ``Embedding(max_norm=...)`` is
    renormalised in a temporary too.

    Randomness: when a submodule in training mode may draw (a dropout with
    ``p > 0``, a forward calling ``F.dropout``...) the layer is ``random``; in
    training mode its forward runs under ``KeyedRandom(key)``: ``nn.Dropout``,
    ``F.dropout``, RNN inter-layer dropout, attention dropout, ``torch.rand``...
    draw from the call's ``key`` (the same key gives the same output). Without
    a key such a draw raises, naming the function. Eval mode draws nothing.

    Compares and hashes by identity. The module's mode (``training``) and
    which parameters are frozen (``requires_grad=False``) are those it had when
    wrapped.

    Args:
        module: any ``torch.nn.Module``.
        state: dotted names of buffers its ``forward`` writes (a running mean, a
            step count...) beyond those functd knows (BatchNorm's statistics and
            spectral_norm's ``_u``/``_v`` in training mode): returned as new state.

    Raises:
        KeyError: a name of ``state`` is not a buffer of ``module``.
        RuntimeError: from a call whose forward wrote a buffer that is not state.
        NotImplementedError: from ``init``; see ``functd.nn.state_to_td``.

    Example:
        >>> bn = torch.nn.BatchNorm1d(3).eval()
        >>> layer, params = FunctionalCall(bn), state_to_td(bn)
        >>> layer(params, torch.randn(4, 3)).shape
        torch.Size([4, 3])
    """

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        _attrs: ClassVar[Any]
        _bslots: ClassVar[Any]
        _buffers: ClassVar[Any]
        _clone: ClassVar[Any]
        _frozen: ClassVar[Any]
        _label: ClassVar[Any]
        _lock: ClassVar[Any]
        _random: ClassVar[Any]
        _rnns: ClassVar[Any]
        _slots: ClassVar[Any]
        _stats: ClassVar[Any]
        _training: ClassVar[Any]

    module: nn.Module
    state: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.module, nn.Module):
            raise TypeError(
                f"FunctionalCall(module) takes an nn.Module; got {type(self.module).__name__}"
            )
        if isinstance(self.state, str) or not all(isinstance(n, str) for n in self.state):
            raise TypeError(
                f"FunctionalCall({type(self.module).__name__}, state=...): state takes a list "
                f"of dotted buffer names, e.g. state=['stats.count']; got {self.state!r}."
            )
        meta = meta_copy(self.module)
        object.__setattr__(self, "module", meta)
        object.__setattr__(self, "state", tuple(self.state))
        buffers = tuple(name for name, _ in meta.named_buffers())
        clone = set(buffers)
        for prefix, sub in meta.named_modules():
            if getattr(sub, "max_norm", None) is not None:  # F.embedding renorms in place
                clone.update(f"{prefix}.{n}" if prefix else n for n, _ in sub.named_parameters())
        frozen = tuple(
            tuple(n.split(".")) for n, p in meta.named_parameters() if not p.requires_grad
        )
        slots = _slots(meta)
        set_derived(
            self,
            _clone=tuple(sorted(clone)),  # sorted once: the same trace in every process
            _stats=state_buffers(meta, self.state),
            _buffers=buffers,
            _bslots=tuple((n, d, attr) for n in buffers for d, attr, _ in slots[n]),
            _attrs=plain_tensor_attrs(meta),
            _slots=slots,
            _training=any(m.training for m in meta.modules()),
            # an eval-mode RNN still goes through KeyedRandom: its handler runs functd's
            # loop where torch's fused op cannot (vmap, grad of an ensemble)
            _rnns=any(isinstance(m, nn.RNNBase) for m in meta.modules()),
            _random=may_draw(meta),
            _frozen=frozen,
            _label=f"FunctionalCall({type(meta).__name__})",
            _lock=threading.Lock(),
        )

    @property
    def random(self) -> bool:  # type: ignore[override]
        """True when a submodule in training mode may draw random numbers (a dropout with
        ``p > 0``...; see ``functd/nn/_draws.py``): the call then takes a ``key``."""
        return self._random

    @property
    def stateful(self) -> bool:
        """True when the module writes buffers that are state (BatchNorm or spectral_norm
        in training mode, or ``state`` names some): a call then returns ``(out, new_state)``."""
        return bool(self._stats)

    def _specs(self) -> dict[str, Any]:
        raise NotImplementedError(NO_INIT.format(name=type(self.module).__name__))

    def init(self, key: Any, dtype: torch.dtype = torch.float32, device: Any = None) -> TensorDict:
        raise NotImplementedError(NO_INIT.format(name=type(self.module).__name__))

    def param_shapes(self) -> dict[tuple[str, ...], tuple[int, ...]]:
        named = chain(self.module.named_parameters(), self.module.named_buffers())
        return {tuple(name.split(".")): tuple(t.shape) for name, t in named}

    def buffer_paths(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(name.split(".")) for name, _ in self.module.named_buffers())

    def with_training(self, training: bool) -> FunctionalCall:
        """A FunctionalCall of the module switched by ``module.train(training)`` (on a
        meta copy: nothing is written); ``self`` when every submodule is in that mode."""
        if all(m.training == training for m in self.module.modules()):
            return self
        return FunctionalCall(meta_copy(self.module).train(training), self.state)

    def frozen_paths(self) -> tuple[tuple[str, ...], ...]:
        """Paths of the parameters that had ``requires_grad=False`` when wrapped."""
        return self._frozen

    def signature(self) -> inspect.Signature:
        """The wrapped module's ``forward`` signature (a dict ``in_keys`` binds to it)."""
        return inspect.signature(self.module.forward)

    def __call__(
        self, params: TensorDict, *inputs: Any, key: Tensor | None = None, **kwargs: Any
    ) -> Any:
        return self.call_with(params, inputs, kwargs, key)

    def call_with(self, params: TensorDict, args: tuple, kwargs: dict, key: Any = None) -> Any:
        """The call with the forward's inputs by position and by name, and the PRNG
        ``key`` apart (a forward may have an argument named ``key``)."""
        flat = flat_state(params)
        if not self._clone:  # no buffer: nothing to clone, watch or return
            return self._run(flat, args, kwargs, key)
        for name in self._clone:  # in a fixed order (fd.jit's cache key on disk)
            if name in flat:
                flat[name] = flat[name].clone()
        out, wrote = self._watched(flat, args, kwargs, key)
        wrote = [n for n in wrote if n not in self._stats]
        if wrote:
            raise RuntimeError(
                UNDECLARED.format(
                    owner=self._label,
                    names=", ".join(repr(n) for n in wrote),
                    names_list=[*self.state, *wrote],
                )
            )
        if not self._stats:
            return out
        state: dict[str, Any] = {}  # the buffers after the call: the new state
        for name in self._stats:
            *parents, leaf = name.split(".")
            node = state
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = flat[name]
        return out, TensorDict(state, [])

    def _watched(self, flat: dict, args: tuple, kwargs: dict, key: Any) -> tuple[Any, list]:
        """``_run``, and the names of the buffers it wrote (see ``_written.py``)."""
        watch = self._buffers
        try:
            given = [flat[n] for n in watch]
        except KeyError:
            _bad_names(self, flat)
        if torch.compiler.is_compiling():  # a version counter is a symbol there
            hit: set[str] = set()
            with WriteWatch(dict(zip(watch, given)), hit):
                out = self._run(flat, args, kwargs, key)
            moved = [n for n, t in zip(watch, given) if n in hit or flat[n] is not t]
            return out, moved
        if is_wrapped is None or any(map(is_wrapped, given)):  # under torch.func
            before = versions(given, False)
            with OutCopies(given):  # writes through out= as copies, which vmap batches
                out = self._run(flat, args, kwargs, key)
            return out, written(flat, watch, given, before, False)
        before = [t._version for t in given]  # plain tensors: written out, the hot path
        out = self._run(flat, args, kwargs, key)
        return out, [
            n for n, t, v in zip(watch, given, before) if flat[n] is not t or t._version != v
        ]

    def _run(self, flat: dict, args: tuple, kwargs: dict, key: Any) -> Any:
        """The forward under ``KeyedRandom`` in training mode (see the class docstring)."""
        if not self._training:
            if not self._rnns:
                return self._forward(flat, args, kwargs)
            with KeyedRandom(key, self._label):
                return self._forward(flat, args, kwargs)
        if torch.compiler.is_compiling():
            with KeyedRandom(key, self._label):
                return self._forward(flat, args, kwargs)
        before = generator_state()
        with KeyedRandom(key, self._label):
            out = self._forward(flat, args, kwargs)
        if not same_state(before, generator_state()):
            restore_state(before)
            raise RuntimeError(GLOBAL_DRAW.format(owner=self._label))
        return out

    def _forward(self, flat: dict, args: tuple, kwargs: dict) -> Any:
        """Run the meta copy's forward on ``flat``; a buffer the forward reassigned
        (``self.buf = ...``) is left in ``flat`` (``functional_call`` does the same)."""
        if torch.compiler.is_compiling():
            try:
                return torch.func.functional_call(self.module, flat, args, kwargs, strict=True)
            finally:
                for d, attr, meta in self._attrs:
                    d[attr] = meta
        slots = self._slots
        if len(flat) != len(slots):
            _bad_names(self, flat)
        with self._lock:  # the meta copy is shared by every caller of this layer
            try:
                for name, value in flat.items():
                    places = slots.get(name)
                    if places is None:
                        _bad_names(self, flat)
                    for d, attr, _ in places:
                        d[attr] = value
                out = self.module(*args, **kwargs)
                for name, d, attr in self._bslots:
                    if d[attr] is not flat[name]:
                        flat[name] = d[attr]
                return out
            finally:  # the meta tensors back: the copy keeps nothing of the call
                for places in slots.values():
                    for d, attr, meta in places:
                        d[attr] = meta
                for d, attr, meta in self._attrs:
                    d[attr] = meta

    def __repr__(self) -> str:
        return f"FunctionalCall({type(self.module).__name__} at {id(self):#x})"

    def __deepcopy__(self, memo: dict) -> FunctionalCall:
        return FunctionalCall(self.module, self.state)  # a fresh meta copy, lock and slots


def _slots(meta: nn.Module) -> dict[str, tuple]:
    """``{dotted name: ((slot dict, attr, meta tensor), ...)}``: every place a tensor of the
    meta copy sits (a tied tensor under each of its names), keyed by the name
    ``state_to_td`` gives it (the first)."""
    first: dict[int, str] = {}
    for name, t in chain(meta.named_parameters(), meta.named_buffers()):
        first.setdefault(id(t), name)
    places: dict[str, list] = {name: [] for name in first.values()}
    seen: set = set()
    for sub in meta.modules():
        for slot in (sub._parameters, sub._buffers):
            for attr, t in slot.items():  # type: ignore[assignment]
                if t is None or (id(slot), attr) in seen:
                    continue
                seen.add((id(slot), attr))
                places[first[id(t)]].append((slot, attr, t))
    return {name: tuple(p) for name, p in places.items()}


def _bad_names(layer: FunctionalCall, flat: dict) -> NoReturn:
    missing = sorted(set(layer._slots) - set(flat))
    extra = sorted(set(flat) - set(layer._slots))
    raise KeyError(
        f"{layer._label}: params do not match the module's parameters and buffers: missing "
        f"{missing or '(none)'}; unexpected {extra or '(none)'}. Take them with "
        "fd.from_module(module)."
    )


def meta_copy(module: nn.Module) -> nn.Module:
    """``deepcopy(module).to("meta")`` without copying the real parameters and buffers."""
    memo: dict[int, Any] = {}
    for t in chain(module.parameters(), module.buffers()):
        if t.device.type == "meta":  # shared: a placeholder without storage, never written
            memo[id(t)] = t
        elif type(t) is nn.Parameter:
            memo[id(t)] = nn.Parameter(torch.empty_like(t, device="meta"), t.requires_grad)
        elif type(t) is Tensor:
            memo[id(t)] = torch.empty_like(t, device="meta")
        elif is_dtensor(t):  # FSDP2 / DTensor shards: a meta tensor of the global shape
            meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
            memo[id(t)] = nn.Parameter(meta, t.requires_grad) if t.requires_grad else meta
    for sub in module.modules():  # plain tensor attributes (weight_norm's hook recomputes
        for v in vars(sub).values():  # `weight`, a non-leaf tensor deepcopy refuses)
            if type(v) is Tensor and id(v) not in memo:
                memo[id(v)] = torch.empty_like(v, device="meta")
    fsdp_meta_copy(module, memo)  # FSDP2 modules forbid deepcopy: their original class
    return copy.deepcopy(module, memo).to("meta")

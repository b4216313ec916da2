"""Buffers a torch module writes in ``forward``: which are state, and catching the others.

``FunctionalCall`` runs a torch module on clones of its buffers. A forward that
writes a buffer (in place: ``add_``, ``copy_``, ``out=``, BatchNorm's kernel; or
by assignment, ``self.buf = ...``) writes the clone. The buffers known to be
written, its *state*, come back as ``new_state`` from ``apply_with_state``:

- ``BatchNorm*`` in training mode with ``track_running_stats``: its statistics;
- ``torch.nn.utils.parametrizations.spectral_norm`` in training mode: ``_u``, ``_v``;
- the older ``torch.nn.utils.spectral_norm`` hook in training mode: ``<name>_u``,
  ``<name>_v``;
- the buffers the user names, ``FunctionalCall(module, state=[...])``.

Any other buffer written during a call is caught after it (``written``: the
version counter of the clone, looked up under ``torch.func``'s wrappers, and the
identity of the tensor in the buffer's slot) and refused (``UNDECLARED``), so a
write is never dropped silently. While ``torch.compile`` traces, a version counter
is a symbol that cannot be compared: ``WriteWatch`` (a torch-function mode, entered
only then) sees the in-place calls on the clones instead. Under ``torch.func``
transforms, ``OutCopies`` turns a write into a buffer through ``out=`` (spectral
norm's power iteration: vmap has no batching rule for ``out=``) into a copy.

Example:
    >>> bn = torch.nn.BatchNorm1d(3)
    >>> state_buffers(bn, ())
    ('running_mean', 'running_var', 'num_batches_tracked')
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.overrides import TorchFunctionMode

from .._td._dtensor import unwrapped

__all__ = [
    "UNDECLARED",
    "OutCopies",
    "WriteWatch",
    "plain_tensor_attrs",
    "state_buffers",
    "versions",
    "written",
]

UNDECLARED = (
    "{owner}: forward wrote the buffer(s) {names} (in place or by assignment), which functd "
    "does not know as state, so the write would be lost. Declare them as state: "
    "fd.Module(fd.nn.FunctionalCall(module, state={names_list}), in_keys, out_keys), then "
    "`out, new_state = m.apply_with_state(params, td)` and "
    "`params = fd.nn.update_state(params, new_state)`; or, if the module writes them only "
    "in training, switch it to eval mode (fd.nn.eval_mode(m), or module.eval() before "
    "wrapping it)."
)


def _known(sub: nn.Module) -> Iterable[str]:
    """The own buffers ``sub`` writes in a call in its current mode (known kinds)."""
    if not sub.training:
        return ()
    if isinstance(sub, nn.modules.batchnorm._NormBase):
        return (n for n, _ in sub.named_buffers(recurse=False)) if sub.track_running_stats else ()
    kind = type(sub)
    if kind.__name__ == "_SpectralNorm" and kind.__module__ == "torch.nn.utils.parametrizations":
        return tuple(n for n, _ in sub.named_buffers(recurse=False))  # _u, _v (2-d weights)
    return tuple(
        f"{hook.name}{end}"
        for hook in sub._forward_pre_hooks.values()
        if isinstance(hook, SpectralNorm)
        for end in ("_u", "_v")
    )


def state_buffers(module: nn.Module, declared: tuple[str, ...]) -> tuple[str, ...]:
    """Dotted names of the buffers a call of ``module`` returns as new state: the known
    writers' (see the module docstring) then ``declared``, each once.

    Raises:
        KeyError: a declared name is not a buffer of ``module``.
    """
    names = [name for name, _ in module.named_buffers()]
    bad = [d for d in declared if d not in names]
    if bad:
        raise KeyError(
            f"FunctionalCall({type(module).__name__}, state=...): {bad} are not buffers of "
            f"the module; its buffers are {names or '(none)'}. Name each buffer its forward "
            "writes by its dotted name, as in module.named_buffers()."
        )
    out = [
        f"{prefix}.{n}" if prefix else n
        for prefix, sub in module.named_modules()
        for n in _known(sub)
    ]
    return tuple(dict.fromkeys(n for n in (*out, *declared) if n in names))


def plain_tensor_attrs(module: nn.Module) -> tuple[tuple[dict[str, Any], str, Tensor], ...]:
    """``(sub.__dict__, attr, tensor)`` for each tensor held as a plain attribute (neither
    parameter nor buffer: the ``weight`` the older ``weight_norm``/``spectral_norm``
    hooks recompute each call), to put back after a call."""
    return tuple(
        (vars(sub), attr, v)
        for sub in module.modules()
        for attr, v in vars(sub).items()
        if isinstance(v, Tensor)
    )


def versions(given: list[Tensor], plain: bool) -> list[int]:
    """The version counters of ``given``; unless ``plain`` (no tensor is a ``torch.func``
    wrapper: ``functd._eager.plain``), the wrapped tensors' (a write through vmap's
    batching rules does not move the wrapper's own counter)."""
    if plain:
        return [t._version for t in given]
    return [unwrapped(t)._version for t in given]


def written(
    flat: dict[str, Tensor],
    names: tuple[str, ...],
    given: list[Tensor],
    before: list[int],
    plain: bool,
) -> list[str]:
    """The names of ``names`` written since ``before``: a slot reassigned (``flat[name]``
    is no longer the ``given`` tensor) or written in place (its version moved)."""
    after = versions(given, plain)
    return [n for n, t, v, w in zip(names, given, before, after) if flat[n] is not t or v != w]


_STATS = ((1, "running_mean", None), (2, "running_var", None))
_NORMS: dict[Any, tuple[Any, ...]] = {  # (position, name, default): written in training only
    torch.nn.functional.batch_norm: (*_STATS, (5, "training", False)),
    torch.nn.functional.instance_norm: (*_STATS, (5, "use_input_stats", True)),
    torch.batch_norm: ((3, "running_mean", None), (4, "running_var", None), (5, "training", 0)),
}


class WriteWatch(TorchFunctionMode):
    """Add to ``hit`` the names of ``tensors`` a torch function writes in place (a method ending in
    ``_``, an in-place operator, ``out=``, a batch norm's running statistics).

    Example:
        >>> buf = torch.zeros(3)
        >>> hit: set = set()
        >>> with WriteWatch({"buf": buf}, hit):
        ...     _ = buf.add_(1)
        >>> hit
        {'buf'}
    """

    def __init__(self, tensors: dict[str, Tensor], hit: set[str]) -> None:
        super().__init__()
        self.tensors = tensors
        self.hit = hit

    def _see(self, t: Any) -> None:
        if isinstance(t, Tensor):
            base = t._base if t._base is not None else t
            for name, v in self.tensors.items():
                if v is base or v is t:
                    self.hit.add(name)

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if args and ((name[-1:] == "_" and name[:2] != "__") or name in _INPLACE):
            self._see(args[0])
        if "out" in kwargs:
            out = kwargs["out"]
            for t in out if isinstance(out, tuple | list) else (out,):
                self._see(t)
        where = _NORMS.get(func)
        if where is not None:  # (running_mean, running_var, training) positions
            *stats, training = (args[i] if i < len(args) else kwargs.get(k, d) for i, k, d in where)
            if training:
                for t in stats:
                    self._see(t)
        return func(*args, **kwargs)


_INPLACE = frozenset(
    f"__i{op}__"
    for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor")
) | {"__setitem__", "copy_", "set_"}


class OutCopies(TorchFunctionMode):
    """Run ``f(..., out=buf)`` for a ``buf`` of ``tensors`` as ``buf.copy_(f(...))``: the
    same values, and ``torch.func.vmap`` batches it (it has no rule for ``out=``).

    Example:
        >>> u = torch.zeros(2)
        >>> with OutCopies([u]):
        ...     _ = torch.mv(torch.eye(2), torch.ones(2), out=u)
        >>> u.tolist()
        [1.0, 1.0]
    """

    def __init__(self, tensors: list[Tensor]) -> None:
        super().__init__()
        self.tensors = tensors

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = kwargs.get("out")
        if isinstance(out, Tensor) and any(out is t for t in self.tensors):
            rest = {k: v for k, v in kwargs.items() if k != "out"}
            return out.copy_(func(*args, **rest))
        return func(*args, **kwargs)

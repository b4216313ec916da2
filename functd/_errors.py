"""Error messages of functd, in one place.

Each message says what failed, where (the key path), and how to fix it.
Functions here only build strings or exceptions; they never raise by themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "FrozenError",
    "InplaceError",
    "fmt_key",
    "fmt_keys",
]


class FrozenError(TypeError, AttributeError):
    """Raised on an attempt to mutate a frozen TensorDict, module or other frozen value:
    a TypeError (mutation is refused) and an AttributeError (as a frozen dataclass's
    ``FrozenInstanceError``)."""


class InplaceError(AttributeError, TypeError):
    """Raised on tensordict's in-place names (``td.set_``): the attribute does not exist
    (an AttributeError, so ``hasattr`` is False) and mutation is refused (a TypeError)."""


def fmt_key(key: Any) -> str:
    """Format a key (a str or a tuple of str) as the user wrote it."""
    if isinstance(key, tuple) and len(key) == 1:
        key = key[0]
    return repr(key)


def fmt_keys(keys: Iterable[Any], limit: int = 20) -> str:
    keys = [fmt_key(k) for k in keys]
    if not keys:
        return "(none)"
    more = f", ... ({len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


SETITEM = (
    "TensorDict is immutable: `td[{key}] = value` is not allowed. "
    "Use `td = td.set({key}, value)`, which returns a new TensorDict."
)
DELITEM = (
    "TensorDict is immutable: `del td[{key}]` is not allowed. "
    "Use `td = td.exclude({key})`, which returns a new TensorDict."
)
SETATTR = (
    "TensorDict is immutable: cannot assign attribute {name!r}. "
    "To add or replace an entry use `td = td.set({name!r}, value)`; "
    "every write returns a new TensorDict."
)
INPLACE = (
    "TensorDict is immutable and has no in-place method {name!r}. "
    "Use the pure `{pure}` instead, which returns a new TensorDict: `td = td.{pure}(...)`."
)
NON_TENSOR = (
    "TensorDict entry {key} has type {type}, not torch.Tensor. Leaves must be tensors "
    "(nested mappings become nested TensorDicts). Convert numbers with "
    "torch.as_tensor(...); keep non-tensor data (strings, configs) outside the "
    "TensorDict, e.g. as static fields of a module."
)
BAD_KEY = (
    "TensorDict keys are str or non-empty tuples of str (a nested path); got {key!r} "
    "of type {type}. Write td[{example}]."
)
DUPLICATE_KEY = (
    "TensorDict(source): the key {key} appears twice (two keys with the same string value, "
    "such as an enum.StrEnum member and its plain str); give each entry once."
)
EMPTY_KEY = (
    "TensorDict keys may not be the empty tuple (); give a str or a tuple of str. "
    "To index all batch dims write td[...]."
)
BATCH_MISMATCH = (
    "TensorDict entry {key} has shape {shape}, which does not start with the batch size "
    "{batch_size}. Every leaf's leading dims must equal batch_size. A leaf shared by every "
    "batch element (an attention mask, a constant) does not belong in a batched TensorDict: "
    "expand it (x.expand({batch_size} + list(x.shape))), or keep it out (close over it in the "
    "module's function, or put it in a TensorDict of batch size []). Only if the batch dims "
    "really are {suggest}, build the TensorDict with batch_size={suggest}."
)
BAD_BATCH = (
    "batch_size must be a sequence of non-negative ints, got {batch_size!r}. "
    "Example: TensorDict({{'x': torch.zeros(5, 3)}}, batch_size=[5])."
)
DEVICE_MISMATCH = (
    "TensorDict was given device={device}, but entry {key} is on {leaf_device}. "
    "Leaves are never copied on construction: move them first, "
    "e.g. TensorDict(data).to({device!r})."
)


def missing_key(
    key: Any, path_done: tuple[Any, ...], available: Iterable[Any], nested_level: int | None
) -> str:
    """Message of the KeyError for a key the TensorDict lacks."""
    head = f"TensorDict has no key {fmt_key(key)}"
    if nested_level is not None and nested_level > 0:
        head += f": the nested path broke after {fmt_key(path_done)} (level {nested_level})"
    return f"{head}; it has: {fmt_keys(available)}."


def wrong_entry(method: str, key: Any, value: Any) -> str:
    """Message of the TypeError of ``td.get_tensor``/``td.get_tensordict`` given the other kind."""
    call = f"TensorDict.{method}({key!r})"
    if method == "get_tensor":
        leaf = (*(key if isinstance(key, tuple) else (key,)), next(iter(value.keys()), "..."))
        return (
            f"{call}: the entry is a nested TensorDict with keys {fmt_keys(value.keys())}, not "
            f"a tensor; name a leaf, e.g. {leaf!r}, or use td.get_tensordict({key!r})."
        )
    return (
        f"{call}: the entry is a tensor of shape {list(value.shape)}, not a nested "
        f"TensorDict; use td.get_tensor({key!r})."
    )


def not_a_td(key: Any, path_done: tuple[Any, ...], type_name: str) -> str:
    return (
        f"TensorDict key {fmt_key(key)} goes through {fmt_key(path_done)}, which is a "
        f"{type_name}, not a nested TensorDict."
    )


def index_too_many(n_used: int, batch_size: Sequence[int]) -> str:
    return (
        f"the index uses {n_used} dims, but the TensorDict has only {len(batch_size)} batch "
        f"dims (batch_size={list(batch_size)}). Indexing a TensorDict indexes its batch "
        f"dims only; to index feature dims use td.apply(lambda x: x[..., i])."
    )


def stack_keys(i: int, first: Iterable[Any], other: Iterable[Any], where: str) -> str:
    first, other = set(first), set(other)
    only_first = sorted(first - other, key=str)
    only_other = sorted(other - first, key=str)
    return (
        f"{where}: TensorDict 0 and TensorDict {i} have different keys; only in 0: "
        f"{fmt_keys(only_first)}; only in {i}: {fmt_keys(only_other)}. "
        "All TensorDicts must have the same keys."
    )


def stack_shapes(
    i: int, key: Any, shape0: Sequence[int], shape_i: Sequence[int], where: str
) -> str:
    return (
        f"{where}: entry {fmt_key(key)} has feature shape {list(shape0)} in TensorDict 0 "
        f"but {list(shape_i)} in TensorDict {i}. All entries must match."
    )


STATE_DROPPED = (
    "{label}: {what} returns new state (BatchNorm's running statistics or spectral_norm's "
    "vectors in training mode, buffers named in FunctionalCall(module, state=...)), which a "
    "plain call would drop. Call `out, new_state = m.apply_with_state(params, td)` "
    "then `params = fd.nn.update_state(params, new_state)`; or switch the model to eval "
    "mode with `m = fd.nn.eval_mode(m)`."
)
HELD_OUT = (
    "{label}: params {paths} are held out of training (buffers, or parameters with "
    "requires_grad=False in the torch module), but they are being differentiated (fd.grad, "
    "fd.train_step, torch.func.grad), so an optimizer would change them where torch would not. "
    "Split them off and differentiate the rest: `params, held = fd.partition(params, "
    "fd.trainable(model))`, then call the model on `fd.combine(params, held)` inside the loss."
)

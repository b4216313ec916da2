"""Error messages of ``functd.optim``: what failed, where (the key path), the fix."""

from __future__ import annotations

from typing import Any

from .._errors import fmt_key, fmt_keys
from .._td._tree import tree

SPLIT_HINT = (
    "Optimizers update floating-point tensors only: split non-trainable entries "
    "(integer buffers such as BatchNorm's 'num_batches_tracked', masks, step counters) "
    "off the params before the optimizer and hand them to the model beside them: "
    "`params, held = fd.partition(params, fd.trainable(model))` (or fd.trainable(params) for "
    "every non-floating entry), optimise `params`, call the model on `fd.combine(params, held)`."
)


def not_a_td(where: str, what: str, value: Any) -> str:
    none = _none_paths(value)
    hint = (
        f" It holds None at [{fmt_keys(none)}]: a TensorDict has no None leaves; leave those "
        "entries out (optax treats a None leaf as an empty subtree, which is the same thing)."
        if none
        else ""
    )
    return (
        f"{where}: {what} must be a functd TensorDict, got a {type(value).__name__}. "
        f"Wrap a dict of tensors with fd.TensorDict({{...}}); opt_state is what "
        f"opt.init(params) returned.{hint}"
    )


def _none_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The key paths of the None leaves of nested dicts, lists and tuples (up to 5)."""
    if value is None:
        return [path] if path else []
    items: Any = ()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(value))
    out: list[tuple[Any, ...]] = []
    for k, v in items:
        out.extend(_none_paths(v, (*path, str(k))))
    return out[:5]


def non_floating(where: str, path: tuple[Any, ...], dtype) -> str:
    return (
        f"{where}: params entry {fmt_key(path)} has dtype {dtype}, which is not a "
        f"floating-point dtype. {SPLIT_HINT}"
    )


def sparse_grad(where: str, path: tuple[Any, ...], layout) -> str:
    return (
        f"{where}: grads entry {fmt_key(path)} is a {layout} tensor (a sparse gradient, from "
        "nn.Embedding(sparse=True) or nn.EmbeddingBag(sparse=True)); functd's optimizers take "
        "dense gradients. Build the layer with sparse=False (functd then lowers it onto "
        "fd.nn.Embedding), or densify the gradients first: grads.apply(lambda g: g.to_dense())."
    )


def wrong_state(where: str, expected: tuple[Any, ...], got: tuple[Any, ...]) -> str:
    return (
        f"{where}: opt_state does not come from this optimizer's init: expected the "
        f"entries [{fmt_keys(sorted(expected))}], got [{fmt_keys(sorted(got))}]. States "
        "are not interchangeable between optimizers (nor between differently configured "
        "ones, e.g. amsgrad or momentum on/off): create it with opt.init(params) using "
        "this same optimizer."
    )


def layout_mismatch(where: str, a_name: str, a, b_name: str, b) -> str:
    a_paths, a_leaves, _ = tree.flatten_with_path(a)
    b_paths, b_leaves, _ = tree.flatten_with_path(b)
    a_map = dict(zip(a_paths, a_leaves))
    b_map = dict(zip(b_paths, b_leaves))
    only_a = [p for p in a_paths if p not in b_map]
    only_b = [p for p in b_paths if p not in a_map]
    if only_a or only_b:
        detail = (
            f"keys only in {a_name}: [{fmt_keys(only_a)}]; keys only in {b_name}: "
            f"[{fmt_keys(only_b)}]"
        )
        first = (only_a or only_b)[0]
    else:
        first = next(p for p in a_paths if a_map[p].shape != b_map[p].shape)
        detail = (
            f"entry {fmt_key(first)} has shape {list(a_map[first].shape)} in {a_name} "
            f"but {list(b_map[first].shape)} in {b_name}"
        )
    return (
        f"{where}: {a_name} and {b_name} differ at key {fmt_key(first)} ({detail}). "
        f"They must have the same keys and shapes: the gradients must be taken with "
        f"respect to the same params the optimizer state was created for "
        f"(opt.init(params))."
    )


def bad_hparam(where: str, name: str, value: Any, rule: str, fix: str = "") -> str:
    return f"{where}({name}={value!r}): {name} must be {rule}.{' ' + fix if fix else ''}"


def needs_params(where: str, what: str) -> str:
    return f"{where}: {what} needs the current params; call opt.update(grads, opt_state, params)."

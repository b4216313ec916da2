"""Running statistics in pure training loops: split, merge, update; train/eval modes.

The running statistics of ``BatchNorm*`` are entries of ``params`` (as in the
torch module's ``state_dict()``). A training step differentiates only the
trainable part and carries the statistics along:

Example:
    >>> trainable, state = fd.nn.split_state(model, params)
    >>> def loss_fn(trainable, state, td):
    ...     out, new_state = model.apply_with_state(fd.nn.merge_state(trainable, state), td)
    ...     return ((out["y"] - td["target"]) ** 2).mean(), new_state
    >>> grads, new_state = torch.func.grad(loss_fn, has_aux=True)(trainable, state, td)
    >>> state = fd.nn.update_state(state, new_state)
    >>> out = fd.nn.eval_mode(model)(fd.nn.merge_state(trainable, state), td)

See ``notes/stateful.md`` for why it looks like this.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from .. import _errors as E
from .._td import TensorDict, from_parts
from .._td._partition import partition
from ..nn._base import Layer
from ..nn._chain import Chain
from ..nn._dropout import Dropout
from ..nn._lower import FunctionalCall
from ._call import ModuleKind

__all__ = [
    "buffer_paths",
    "eval_mode",
    "layer_with_training",
    "merge_state",
    "split_state",
    "train_mode",
    "update_state",
]

Path = tuple[str, ...]


def buffer_paths(module: Any) -> tuple[Path, ...]:
    """Paths of the entries of a module's params that are buffers (running statistics).

    Args:
        module: a module of any kind (``fd.Module``, ``fd.Sequential``, ...: its
            ``own_buffer_paths()`` and its children's, nested under their names),
            a functd layer or a ``torch.nn.Module`` (its ``named_buffers``).

    Raises:
        TypeError: ``module`` is none of these.

    Example:
        >>> buffer_paths(fd.nn.BatchNorm1d(3))
        (('running_mean',), ('running_var',), ('num_batches_tracked',))
    """
    if isinstance(module, ModuleKind):
        return module.own_buffer_paths() + tuple(
            (name, *path)
            for name, m in module.children()
            if m.has_params
            for path in buffer_paths(m)
        )
    if isinstance(module, Layer):
        return module.buffer_paths()
    if isinstance(module, torch.nn.Module):
        return tuple(tuple(name.split(".")) for name, _ in module.named_buffers())
    raise TypeError(
        f"buffer_paths(module): expected a module (fd.Module, fd.Sequential, ...), functd layer or "
        f"torch.nn.Module; got a {type(module).__name__}."
    )


def split_state(module: Any, params: TensorDict) -> tuple[TensorDict, TensorDict]:
    """Split ``params`` into ``(trainable, state)``: the running statistics go to ``state``.

    Differentiate and optimise ``trainable`` only (``num_batches_tracked`` is an
    integer, and weight decay must not touch ``running_mean``); carry ``state``
    along and refresh it with ``update_state``. ``merge_state`` is the inverse.

    Args:
        module: the module the params belong to (see ``buffer_paths``).
        params: its params.

    Returns:
        ``(trainable, state)``, both of the batch size of ``params``; nested
        entries left empty by the split are dropped.

    Raises:
        KeyError: ``params`` lacks a buffer of ``module`` (params of another module).

    Example:
        >>> trainable, state = split_state(bn, bn.init(0))
        >>> trainable.keys(), state.keys()
        (('weight', 'bias'), ('running_mean', 'running_var', 'num_batches_tracked'))
    """
    paths = buffer_paths(module)
    flat = {_path(k): v for k, v in params.items(True, True)}
    missing = [p for p in paths if p not in flat]
    if missing:
        raise KeyError(
            f"split_state(module, params): params lack the buffer(s) {E.fmt_keys(missing)} of "
            f"the module; they have {E.fmt_keys(list(flat))}. Were the params made for another "
            "module? Use module.init(key) or fd.from_module(module)."
        )
    held = set(paths)
    state, trainable = partition(params, lambda path, leaf: path in held)
    return trainable, state


def merge_state(trainable: TensorDict, state: TensorDict) -> TensorDict:
    """The params of a module from its two parts; the inverse of ``split_state``.

    Raises:
        TypeError: an argument is not a TensorDict.
        KeyError: an entry is in both parts.

    Example:
        >>> params = merge_state(*split_state(bn, params))
    """
    _check_tds("merge_state", trainable, state)
    have = {_path(k) for k in trainable.keys(True, True)}
    both = [k for k in (_path(k) for k in state.keys(True, True)) if k in have]
    if both:
        raise KeyError(
            f"merge_state(trainable, state): {E.fmt_keys(both)} in both parts; give the "
            "two halves returned by split_state (or use update_state to replace entries)."
        )
    return trainable.update(state)


def update_state(params: TensorDict, new_state: TensorDict) -> TensorDict:
    """New params (or state) with the entries of ``new_state`` replaced.

    ``new_state`` is the second result of ``m.apply_with_state(params, td)``;
    ``params`` may be the full params or the ``state`` half of ``split_state``.

    Raises:
        TypeError: an argument is not a TensorDict.
        KeyError: ``new_state`` has an entry that ``params`` lacks.
        ValueError: an entry's shape differs.

    Example:
        >>> out, new_state = seq.apply_with_state(params, td)
        >>> params = update_state(params, new_state)
    """
    _check_tds("update_state", params, new_state)
    old = {_path(k): v for k, v in params.items(True, True)}
    for k, v in new_state.items(True, True):
        k = _path(k)
        if k not in old:
            raise KeyError(
                f"update_state(params, new_state): new_state has {E.fmt_key(k)}, which params "
                "lack. Pass the params (or the state half of split_state) of the module that "
                "returned new_state."
            )
        if v.shape != old[k].shape:
            raise ValueError(
                f"update_state(params, new_state): new_state{list(k)} has shape "
                f"{list(v.shape)} but params{list(k)} has {list(old[k].shape)}."
            )
    return params.update(new_state) if not new_state.is_empty() else params


def eval_mode(module: Any) -> Any:
    """The same model in eval mode, as ``torch.nn.Module.eval()``: BatchNorm
    normalises with its running statistics, Dropout is the identity.

    Returns a new module (or layer); ``module`` is unchanged. The params are
    the same. Torch modules run through ``FunctionalCall`` are switched too.
    Each module kind switches itself (``with_training``).

    Raises:
        TypeError: ``module`` is not an fd.Module, fd.Sequential or functd layer.

    Example:
        >>> evaluate = fd.nn.eval_mode(model)
        >>> out = evaluate(params, td)
    """
    return _set_mode(module, False)


def train_mode(module: Any) -> Any:
    """The same model in training mode (``torch.nn.Module.train()``); see ``eval_mode``.

    Example:
        >>> model = fd.nn.train_mode(fd.nn.eval_mode(model))
    """
    return _set_mode(module, True)


# ------------------------------------------------------------------ helpers
def _set_mode(obj: Any, training: bool) -> Any:
    if isinstance(obj, ModuleKind):
        return obj.with_training(training)
    if isinstance(obj, Layer):
        return layer_with_training(obj, training)
    if isinstance(obj, torch.nn.Module):
        name = "train" if training else "eval"
        raise TypeError(
            f"{name}_mode(module) switches functd modules and returns a new one; "
            f"{type(obj).__name__} is a torch module. Wrap it first, "
            f"fd.nn.{name}_mode(fd.Module(model, in_keys, out_keys)), or switch the torch "
            f"module itself (model.{name}(), in place) before wrapping it."
        )
    raise TypeError(
        f"{'train' if training else 'eval'}_mode(module): expected an fd.Module, fd.Sequential or "
        f"functd layer; got a {type(obj).__name__}."
    )


def layer_with_training(obj: Layer, training: bool) -> Layer:
    """A functd layer switched to training or eval mode (``self`` when unchanged):
    the layers of a ``Chain``, Dropout's ``inference``, a ``FunctionalCall``'s torch
    module (a meta copy), a ``training`` field."""
    if isinstance(obj, Chain):
        layers = tuple(layer_with_training(layer, training) for layer in obj.layers)
        same = all(a is b for a, b in zip(layers, obj.layers))
        return obj if same else dataclasses.replace(obj, layers=layers)
    if isinstance(obj, Dropout):
        return (
            obj if obj.inference != training else dataclasses.replace(obj, inference=not training)
        )
    if isinstance(obj, FunctionalCall):
        if all(m.training == training for m in obj.module.modules()):
            return obj
        return FunctionalCall(copy.deepcopy(obj.module).train(training))  # a meta copy
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else ()
    if "training" in fields and obj.training != training:  # type: ignore[attr-defined]
        return dataclasses.replace(obj, training=training)  # type: ignore[type-var]
    return obj


def _path(key: Any) -> Path:
    return key if isinstance(key, tuple) else (key,)


def _prune(td: TensorDict, bs: torch.Size) -> TensorDict:
    """Drop nested TensorDicts left without leaves."""
    data = {}
    for k, v in td._data.items():
        if type(v) is TensorDict:
            v = _prune(v, v.batch_size)
            if not v._data:
                continue
        data[k] = v
    return from_parts(data, bs)


def _check_tds(name: str, a: Any, b: Any) -> None:
    for arg, v in (("first", a), ("second", b)):
        if not isinstance(v, TensorDict):
            raise TypeError(
                f"{name}: the {arg} argument must be a TensorDict, got {type(v).__name__}."
            )

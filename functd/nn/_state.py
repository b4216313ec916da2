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

Every function here asks the model itself (``HasMode``: ``with_training``,
``buffer_paths``), so it knows neither the layers nor the module kinds. See
``notes/stateful.md`` for why it looks like this.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from .. import _errors as E
from .._td import TensorDict
from .._td._partition import partition

__all__ = [
    "HasMode",
    "buffer_paths",
    "eval_mode",
    "merge_state",
    "split_state",
    "train_mode",
    "update_state",
]

Path = tuple[str, ...]


@runtime_checkable
class HasMode(Protocol):
    """What ``eval_mode``/``train_mode`` and ``buffer_paths``/``split_state`` ask of a
    model: every functd layer (``Layer``) and every module kind (``fd.Module``,
    ``fd.Sequential``, ``fd.Probabilistic``..., ``ModuleKind``) answers for itself, so
    these functions know neither the layers nor the module kinds.

    Example:
        >>> isinstance(fd.nn.Dropout(0.5), HasMode), isinstance(torch.nn.ReLU(), HasMode)
        (True, False)
    """

    def with_training(self, training: bool) -> Any:
        """The same model in training (True) or eval mode; ``self`` when unchanged."""
        ...

    def buffer_paths(self) -> tuple[Path, ...]:
        """Paths (in the model's params) of its running statistics."""
        ...


def buffer_paths(module: Any) -> tuple[Path, ...]:
    """Paths of the entries of a module's params that are buffers (running statistics).

    Args:
        module: a module of any kind (``fd.Module``, ``fd.Sequential``, ...: its own
            buffers and its children's, nested under their names), a functd layer
            (both answer ``module.buffer_paths()``) or a ``torch.nn.Module`` (its
            ``named_buffers``).

    Raises:
        TypeError: ``module`` is none of these.

    Example:
        >>> buffer_paths(fd.nn.BatchNorm1d(3))
        (('running_mean',), ('running_var',), ('num_batches_tracked',))
    """
    if isinstance(module, torch.nn.Module):
        return tuple(tuple(name.split(".")) for name, _ in module.named_buffers())
    if isinstance(module, type) or not callable(own := getattr(module, "buffer_paths", None)):
        raise TypeError(
            "buffer_paths(module): expected a module (fd.Module, fd.Sequential, ...), functd "
            f"layer or torch.nn.Module; got a {type(module).__name__}."
        )
    return own()


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
    Each layer and module kind switches itself: this is
    ``module.with_training(False)`` (see ``HasMode``).

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
    name = "train" if training else "eval"
    if isinstance(obj, torch.nn.Module):
        raise TypeError(
            f"{name}_mode(module) switches functd modules and returns a new one; "
            f"{type(obj).__name__} is a torch module. Wrap it first, "
            f"fd.nn.{name}_mode(fd.Module(model, in_keys, out_keys)), or switch the torch "
            f"module itself (model.{name}(), in place) before wrapping it."
        )
    if isinstance(obj, type) or not callable(switch := getattr(obj, "with_training", None)):
        raise TypeError(
            f"{name}_mode(module): expected an fd.Module, fd.Sequential or functd layer; got "
            f"a {type(obj).__name__}."
        )
    return switch(training)


def _path(key: Any) -> Path:
    return key if isinstance(key, tuple) else (key,)


def _check_tds(name: str, a: Any, b: Any) -> None:
    for arg, v in (("first", a), ("second", b)):
        if not isinstance(v, TensorDict):
            raise TypeError(
                f"{name}: the {arg} argument must be a TensorDict, got {type(v).__name__}."
            )

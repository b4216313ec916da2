"""``fd.trainable``: which params entries torch would train.

``fd.from_module(model)`` returns every tensor the model's forward reads:
trainable parameters, parameters with ``requires_grad=False`` and buffers
(``position_ids``, BatchNorm's statistics, a rotary ``inv_freq``, BART's
``final_logits_bias``). A ``torch.optim`` optimizer built from
``model.parameters()`` trains only the first; ``fd.trainable(model)`` is the
filter that says so, for ``fd.partition``:

Example:
    >>> params, held = fd.partition(fd.from_module(model), fd.trainable(model))
    >>> def loss_fn(params, batch, key):
    ...     out = model(fd.combine(params, held), batch, key=key)
    ...     return out["loss"]
    >>> opt_state = opt.init(params)               # trains what torch would train
"""

from __future__ import annotations

from typing import Any

import torch

from .._frozen import Frozen
from .._td import TensorDict
from ._call import ModuleKind

__all__ = ["Trainable", "trainable"]

Path = tuple[str, ...]


class Trainable(Frozen):
    """A filter ``(path, leaf) -> bool`` for ``fd.partition``: true for floating leaves
    whose path is not held out (a buffer or a frozen parameter).

    Attributes:
        held: the held-out paths (a frozenset of tuples of str).
    """

    __slots__ = ("held",)
    held: Any

    def __init__(self, held: frozenset[Path] = frozenset()) -> None:
        object.__setattr__(self, "held", frozenset(held))

    def __call__(self, path: Path, leaf: Any) -> bool:
        return (
            isinstance(leaf, torch.Tensor)
            and (leaf.is_floating_point() or leaf.is_complex())
            and path not in self.held
        )

    def _identity(self) -> tuple:
        return (self.held,)

    def __repr__(self) -> str:
        return f"Trainable(held={sorted(self.held)!r})"


def trainable(model: Any) -> Trainable:
    """The filter of the params entries that torch would train, for ``fd.partition``.

    Args:
        model: a module of any kind (``fd.Module``, ``fd.Sequential``, ...: the
            buffers of its layers and the parameters that had ``requires_grad=False``
            in the torch modules it wraps, as they were when wrapped); a
            ``torch.nn.Module`` (its buffers and frozen parameters now); or a
            TensorDict of params (only non-floating leaves are held out).

    Returns:
        A ``Trainable``: ``keep(path, leaf)`` is true for a floating leaf that is
        neither a buffer nor a frozen parameter.

    Raises:
        TypeError: ``model`` is none of these.

    Example:
        >>> bert.embeddings.requires_grad_(False)
        >>> m = fd.Module(bert, ["input_ids"], ["last_hidden_state"])
        >>> params, held = fd.partition(fd.from_module(m), fd.trainable(m))
        >>> "embeddings" in held.keys()
        True
    """
    if isinstance(model, ModuleKind):
        return Trainable(frozenset(_held(model)))
    if isinstance(model, torch.nn.Module):
        held = {tuple(n.split(".")) for n, _ in model.named_buffers()}
        held.update(tuple(n.split(".")) for n, p in model.named_parameters() if not p.requires_grad)
        return Trainable(frozenset(held))
    if isinstance(model, TensorDict):
        return Trainable()
    raise TypeError(
        f"fd.trainable(model) takes a module (fd.Module, fd.Sequential, ...), a torch.nn.Module "
        f"or a TensorDict of params; got a {type(model).__name__}."
    )


def _held(module: ModuleKind) -> list[Path]:
    out = list(module.own_held_paths())
    for name, child in module.children():
        if child.has_params:
            out.extend((name, *p) for p in _held(child))
    return out

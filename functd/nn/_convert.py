"""Between a torch module's state and a TensorDict: ``state_to_td`` and ``load_td``."""

from __future__ import annotations

from itertools import chain
from typing import Any

import torch
from torch import nn

from .._td import TensorDict

__all__ = ["flat_state", "load_td", "state_to_td"]


def _named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters then buffers, dotted names; a tied tensor once (under its first name)."""
    return list(chain(module.named_parameters(), module.named_buffers()))


def state_to_td(module: nn.Module) -> TensorDict:
    """The parameters and buffers of ``module`` as a TensorDict of ``batch_size []``.

    Names are those of ``module.state_dict()``, nested at the dots
    (``"out_proj.weight"`` -> ``td["out_proj", "weight"]``), with two
    differences that ``torch.func.functional_call`` needs: non-persistent
    buffers are included, and a tensor shared under several names (tied
    weights) appears once, under its first name.

    The leaves are ``tensor.detach()``: they share memory with the module but
    carry no autograd link to it (take gradients w.r.t. the TensorDict with
    ``torch.func.grad``); ``.clone()`` the result for an independent copy.

    Example:
        >>> td = state_to_td(torch.nn.Linear(3, 4))
        >>> td["weight"].shape
        torch.Size([4, 3])
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"state_to_td(module) takes a torch.nn.Module; got a {type(module).__name__}"
        )
    out: dict[str, Any] = {}
    for name, tensor in _named_tensors(module):
        *parents, leaf = name.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = tensor.detach()
    return TensorDict(out, [])


def flat_state(params: TensorDict) -> dict[str, torch.Tensor]:
    """The leaves of ``params`` keyed by dotted names (``("a", "b")`` -> ``"a.b"``)."""
    out: dict[str, torch.Tensor] = {}
    _flatten_into(params, "", out)
    return out


def _flatten_into(td: TensorDict, prefix: str, out: dict[Any, Any]) -> None:
    for k, v in td._data.items():
        if isinstance(v, TensorDict):
            _flatten_into(v, f"{prefix}{k}.", out)
        else:
            out[prefix + k] = v


def load_td(params: TensorDict, module: nn.Module) -> nn.Module:
    """Copy the values of ``params`` into the existing parameters and buffers of ``module``.

    The inverse of ``state_to_td``: the keys must be exactly the module's
    (same names, same shapes); values are copied in place under
    ``torch.no_grad()`` (cast to each tensor's dtype and device). Nothing is
    copied unless every key and shape matches.

    Returns:
        ``module`` itself.

    Raises:
        TypeError: ``params`` is not a TensorDict, or ``module`` not an nn.Module.
        KeyError: keys are missing from ``params`` or unexpected by ``module``.
        ValueError: a shape differs (the message names the path and both shapes).

    Example:
        >>> lin = torch.nn.Linear(3, 4)
        >>> load_td(state_to_td(lin).apply(torch.zeros_like), lin).weight.abs().sum().item()
        0.0
    """
    if not isinstance(params, TensorDict):
        raise TypeError(
            f"load_td(params, module): params must be a TensorDict; got {type(params).__name__}"
        )
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"load_td(params, module): module must be an nn.Module; got {type(module).__name__}"
        )
    given = flat_state(params)
    targets = dict(_named_tensors(module))
    missing = [k for k in targets if k not in given]
    unexpected = [k for k in given if k not in targets]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing key(s) {_paths(missing)}")
        if unexpected:
            parts.append(f"unexpected key(s) {_paths(unexpected)}")
        raise KeyError(
            f"load_td(params, {type(module).__name__}): {'; '.join(parts)}. The keys must be the "
            f"module's parameter and buffer names, as given by functd.nn.state_to_td(module)."
        )
    for name, value in given.items():
        if value.shape != targets[name].shape:
            raise ValueError(
                f"load_td(params, {type(module).__name__}): params[{_path(name)}] has shape "
                f"{list(value.shape)} but the module's {name!r} has shape "
                f"{list(targets[name].shape)}."
            )
    with torch.no_grad():
        for name, value in given.items():
            targets[name].copy_(value)
    return module


def _path(name: str) -> str:
    parts = name.split(".")
    return repr(parts[0]) if len(parts) == 1 else repr(tuple(parts))


def _paths(names: list[str]) -> str:
    return ", ".join(_path(n) for n in names)

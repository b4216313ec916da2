"""Parameters in and out of torch modules: ``fd.from_module`` and ``fd.to_module``.

Example:
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    >>> params = fd.from_module(net)             # {"0": {"weight", "bias"}}
    >>> fd.to_module(params.apply(torch.zeros_like), net)   # loads values into net
"""

from __future__ import annotations

from typing import Any

import torch

from .._td import TensorDict, _new
from ._module import Module
from ._sequential import Sequential

__all__ = ["from_module", "to_module"]


def from_module(module: Any) -> TensorDict:
    """The parameters (and buffers) a module holds now, as a TensorDict.

    Args:
        module: a ``torch.nn.Module`` (names as in its ``state_dict``, nested at
            dots), or an ``fd.Module``/``fd.Sequential`` (the weights its wrapped
            torch modules hold now, in the layout its ``init`` returns).

    Raises:
        TypeError: an ``fd.Module`` with parameters that wraps no torch module
            (its weights exist only as ``init`` results).
    """
    from ..nn import state_to_td

    if isinstance(module, Sequential):
        data = {}
        for name, m in zip(module.names, module.modules):
            if m.has_params:
                data[name] = from_module(m)
        return _new(data, torch.Size([]))
    if isinstance(module, Module):
        if module._source is not None:
            return state_to_td(module._source)
        if module.has_params:
            raise TypeError(
                f"fd.from_module: {module._label()} wraps the functd layer {module.fn!r}, not a "
                "torch module, so it holds no weights; create them with m.init(fd.random.key(0))."
            )
        return _new({}, torch.Size([]))
    if isinstance(module, torch.nn.Module):
        return state_to_td(module)
    raise TypeError(
        f"fd.from_module takes a torch.nn.Module, fd.Module or fd.Sequential, got {type(module).__name__}"
    )


def to_module(params: TensorDict, module: Any) -> Any:
    """Copy ``params`` into the tensors of ``module`` (a torch module, or the torch
    modules an ``fd.Module``/``fd.Sequential`` wraps) and return it.

    This is the one functd function that writes: it exists to hand trained
    weights back to torch code. ``params`` itself is not changed.

    Raises:
        KeyError, ValueError: missing/unexpected entries or wrong shapes (names the path).
    """
    from ..nn import load_td

    if isinstance(module, Sequential):
        for name, m in zip(module.names, module.modules):
            if m.has_params:
                to_module(params[name], m)
        return module
    if isinstance(module, Module):
        if module._source is None:
            raise TypeError(f"fd.to_module: {module._label()} wraps no torch module to load into.")
        load_td(params, module._source)
        return module
    if isinstance(module, torch.nn.Module):
        return load_td(params, module)
    raise TypeError(
        f"fd.to_module takes a torch.nn.Module, fd.Module or fd.Sequential, got {type(module).__name__}"
    )

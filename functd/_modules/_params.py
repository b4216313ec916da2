"""Parameters in and out of torch modules: ``fd.from_module`` and ``fd.to_module``.

Example:
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    >>> params = fd.from_module(net)             # {"0": {"weight", "bias"}}
    >>> fd.to_module(params.apply(torch.zeros_like), net)   # loads values into net
"""

from __future__ import annotations

from typing import Any

import torch

from .._td import TensorDict, from_parts
from ..nn._convert import load_td, state_to_td
from ._call import ModuleKind, param_sources

__all__ = ["from_module", "to_module"]


def from_module(module: Any) -> TensorDict:
    """The parameters (and buffers) a module holds now, as a TensorDict.

    Args:
        module: a ``torch.nn.Module`` (names as in its ``state_dict``, nested at
            dots), or a module of any kind (``fd.Module``, ``fd.Sequential``, ...: the
            weights its wrapped torch modules hold now, in the layout its ``init``
            returns, read through its ``children()`` and ``torch_source()``).

    Raises:
        TypeError: an ``fd.Module`` with parameters that wraps no torch module
            (its weights exist only as ``init`` results).
    """
    if isinstance(module, ModuleKind):
        kids = module.children()
        if kids:
            data = {name: from_module(m) for name, m in kids if m.has_params}
            return from_parts(data, torch.Size([]))
        source = module.torch_source()
        if source is not None:
            return state_to_td(source)
        if module.has_params:
            if not param_sources(module)[1]:  # a FunctionalCall inside: no init either
                raise TypeError(
                    f"fd.from_module: {module._label()} wraps {module.fn!r}, a layer made from "  # type: ignore[attr-defined]
                    "a torch module (fd.nn.lower keeps the config, never the weights). Pass the "
                    "torch module itself, fd.Module(net, in_keys, out_keys): fd.from_module "
                    "reads its weights."
                )
            raise TypeError(
                f"fd.from_module: {module._label()} wraps the functd layer {module.fn!r}, not a "  # type: ignore[attr-defined]
                "torch module, so it holds no weights; create them with m.init(fd.random.key(0))."
            )
        return from_parts({}, torch.Size([]))
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
    if isinstance(module, ModuleKind):
        kids = module.children()
        if kids:
            for name, m in kids:
                if m.has_params:
                    to_module(params[name], m)  # type: ignore[arg-type]
            return module
        source = module.torch_source()
        if source is None:
            raise TypeError(f"fd.to_module: {module._label()} wraps no torch module to load into.")
        load_td(params, source)
        return module
    if isinstance(module, torch.nn.Module):
        return load_td(params, module)
    raise TypeError(
        f"fd.to_module takes a torch.nn.Module, fd.Module or fd.Sequential, got {type(module).__name__}"
    )

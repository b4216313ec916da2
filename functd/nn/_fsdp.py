"""FSDP2 (``torch.distributed.fsdp.fully_shard``) modules seen as their original class.

``fully_shard(m)`` swaps ``m``'s class for ``FSDP<Class>`` (a subclass of
``FSDPModule`` and the original class), registers forward hooks that gather and
free the sharded parameters, stores its state under private keys, and forbids
``deepcopy``. functd reads such a module's configuration as that of the original
class: ``lower`` matches the original class and ignores FSDP's own hooks, and the
meta copy of ``FunctionalCall`` is an instance of the original classes without
FSDP's hooks and state. The parameters (``fd.from_module``) are the module's
``DTensor`` shards; a functd call runs on them as DTensors, without FSDP's hooks.

Example:
    >>> net = fully_shard(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    >>> m = fd.Module(net, in_keys=["x"], out_keys=["y"])    # a Chain of pure layers
    >>> out = m(fd.from_module(net), td)                     # DTensor params
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from torch import nn

from .._td._dtensor import seen

__all__ = ["fsdp_meta_copy", "is_fsdp", "orig_type", "user_hooks"]

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_HOOK_SIDE = (
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
)
_FSDP_ATTRS = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")
_STATE_PREFIX = "__composable_api_state_key"


def _fsdp_module_type() -> type | None:
    mod = sys.modules.get("torch.distributed.fsdp")
    return getattr(mod, "FSDPModule", None) if mod is not None else None


def is_fsdp(m: Any) -> bool:
    t = _fsdp_module_type()
    return t is not None and isinstance(m, t)


def orig_type(m: nn.Module) -> type:
    """The class ``m`` had before ``fully_shard`` (``type(m)`` for other modules)."""
    cls = type(m)
    if not is_fsdp(m):
        return cls
    seen()  # its params are DTensors: the params check looks for them from now on
    return cls.__mro__[getattr(cls, "_orig_cls_mro_index", 2)]


def _is_fsdp_hook(hook: Any) -> bool:
    owner = getattr(hook, "__self__", None)
    where = type(owner).__module__ if owner is not None else getattr(hook, "__module__", "")
    return (where or "").startswith("torch.distributed.fsdp")


def user_hooks(m: nn.Module) -> bool:
    """Whether ``m`` has hooks of its own (FSDP's are not counted)."""
    for name in _HOOK_DICTS:
        hooks = getattr(m, name, None)
        if hooks and any(not _is_fsdp_hook(h) for h in hooks.values()):
            return True
    return False


def _plain_copy(m: nn.Module, memo: dict[Any, Any]) -> nn.Module:
    """``m`` as an instance of its original class, FSDP's hooks and state left out."""
    cls = orig_type(m)
    new = cls.__new__(cls)  # type: ignore[call-overload]
    dropped: set[Any] = set()
    state: dict[str, Any] = {}
    for k, v in m.__dict__.items():
        if k.startswith(_STATE_PREFIX) or k in _FSDP_ATTRS:
            continue
        if k in _HOOK_DICTS:
            kept = type(v)()
            for hid, h in v.items():
                if _is_fsdp_hook(h):
                    dropped.add(hid)
                else:
                    kept[hid] = h
            v = kept
        state[k] = v
    for k in _HOOK_SIDE:
        if k in state:
            state[k] = type(state[k])((h, x) for h, x in state[k].items() if h not in dropped)
    new.__dict__.update(copy.deepcopy(state, memo))
    return new


def fsdp_meta_copy(module: nn.Module, memo: dict[Any, Any]) -> None:
    """Fill ``memo`` with FSDP-free copies of the FSDP modules inside ``module``
    (deepest first), so that ``copy.deepcopy(module, memo)`` never meets one."""
    for sub in reversed(list(module.modules())):
        if is_fsdp(sub) or any(k in sub.__dict__ for k in _FSDP_ATTRS):
            memo[id(sub)] = _plain_copy(sub, memo)

"""Transforms of a jitted function: ``T(fd.jit(f))`` is ``fd.jit(T(f))``, as in JAX.

``fd.jit``'s compiled code runs on plain tensors, so torch.func cannot trace
through it. But functd knows both transforms: ``fd.grad``, ``fd.value_and_grad``,
``fd.jacrev``, ``fd.jacfwd``, ``fd.hessian``, ``fd.vmap``, ``fd.jvp`` and
``fd.vjp``, given a jitted function, transform the function it wraps and jit the
result with the same options (``static_argnums``, ``dynamic``, ``cache_size``,
``backend``, ``cuda_graph``; nothing is donated: the outputs of a transform are
not the inputs' values). JAX's semantics are the same: ``grad(jit(f))`` and
``jit(grad(f))`` compute the same function, and both are compiled.

The derived wrapper is kept on the jitted function (``_Jitted._derive``), keyed by
the transform and its options, so ``fd.grad(jf)`` built again inside a loop
reuses its compiled code. Options that cannot be hashed (an ``in_dims`` dict)
build a fresh wrapper each time ``T(jf)`` is built (each still compiles once per
signature).

Example:
    >>> jloss = fd.jit(loss)
    >>> grads = fd.grad(jloss)(params, td)      # runs fd.jit(fd.grad(loss)), compiled
    >>> fd.grad(jloss) is fd.grad(jloss)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["derived", "is_jitted"]


def is_jitted(f: Any) -> bool:
    """Whether ``f`` is a function returned by ``fd.jit``."""
    return getattr(f, "_fd_jit_derive", None) is not None


def derived(
    f: Any,
    key: tuple[Any, ...],
    build: Callable[[Callable[..., Any]], Callable[..., Any]],
    static: bool = True,
) -> Any:
    """``fd.jit(build(inner))`` with ``f``'s options when ``f`` is a jitted function
    (``inner`` the function it wraps; cached on ``f`` under ``key``, a tuple whose
    first item names the transform), else None. ``static=False``: ``build`` changes
    the argument list (``fd.jvp``'s ``(primals, tangents)``), so ``f``'s
    ``static_argnums`` do not apply (its non-tensor leaves are static anyway)."""
    derive = getattr(f, "_fd_jit_derive", None)
    if derive is None:
        return None
    return derive(key, build, static)

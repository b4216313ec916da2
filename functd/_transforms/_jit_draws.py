"""What ``fd.jit`` counts as a draw from torch's global generator, and where a refused
draw happened.

torch tags ops by what they *may* do: the fused attention kernels are
``nondeterministic_seeded`` whatever their ``dropout_p``, and so are the RNN ops and
dropout whatever ``train``. ``draws`` counts a tagged op as a draw only when its
arguments allow one (a literal 0 dropout, one RNN layer, ``train=False`` do not).
When a draw is refused, ``draw_site`` runs the function once more on the trace's
fake tensors under a dispatch mode that stops at the first drawing op, to name the
torch function called, the innermost torch module (and its submodule path), the
functd module and the line; ``fix`` says the way around. Only the error path pays.

Example:
    >>> draws(torch.ops.aten.bernoulli.p, (x, 0.5), {})
    True
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from .._torch.fake import FakeTensorMode
from .._torch.ops import OpOverload

__all__ = ["GLOBAL_RANDOM", "draw_site", "draws"]

_TORCH_DIR = os.path.dirname(torch.__file__)


GLOBAL_RANDOM = (
    "{name}: the function draws from torch's global generator ({op}){site}, a global side "
    "effect a compiled function would replay with frozen state. {fix}"
)
FIX_KEYS = (
    "In functd randomness comes from keys: pass a key as an argument (fd.random.key(0)) "
    "and draw with fd.random.normal(key, shape) or call modules with key=."
)
FIX_ATTENTION = (
    "Draw attention dropout from a key: fd.nn.scaled_dot_product_attention(q, k, v, "
    "dropout_p=p, key=key) (functd answers torch's F.scaled_dot_product_attention with it "
    "in a torch module in training mode called with key=), or pass dropout_p=0.0."
)
FIX_EVAL_MODULE = (
    "{module} draws in eval mode, where functd gives a torch module no key: draw only when "
    "`self.training` (then functd answers torch.rand, F.dropout, ... with draws from the "
    "call's key=), or pass the noise in as an input drawn with fd.random; or call the "
    "model without fd.jit."
)
FIX_HIDDEN = (
    "In a torch module in training mode functd answers the random functions it knows "
    "(F.dropout, torch.rand, torch.normal, ...) with draws from the call's key=; this draw "
    "comes from one it has no keyed version of, or runs inside another torch function: "
    "draw with one of those (or pass the noise in as an input drawn with fd.random), or "
    "call the model without fd.jit."
)


def draws(op: Any, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> bool:
    """Whether a call of ``op`` draws from torch's global generator: the op is tagged
    ``nondeterministic_seeded`` and its arguments do not rule the draw out. torch tags
    an op by what it may do: the fused attention kernels whatever their ``dropout_p``,
    ``aten.lstm``/``gru``/``rnn_*`` whatever their ``dropout``, dropout whatever its
    ``train``. ``dropout_p`` or ``dropout`` 0 (attention in eval), one RNN layer (its
    dropout acts between layers) or ``train``/``training`` False draw nothing."""
    if not isinstance(op, OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    schema = op._schema.arguments
    value = {a.name: a.default_value for a in schema}
    value.update(zip((a.name for a in schema), args))
    value.update(kwargs)
    if value.get("train") is False or value.get("training") is False:
        return False
    if value.get("num_layers") == 1:
        return False
    return not any(type(value.get(p)) in (int, float) and value[p] == 0 for p in _DROPOUT)


_DROPOUT = ("dropout_p", "dropout")


class _Draw(Exception):
    """Raised by ``_FindDraw`` at the first draw, with the Python frame that made it."""

    def __init__(self, op: Any, frame: Any) -> None:
        super().__init__()
        self.op, self.frame = op, frame


def draw_site(
    op: Any, fn: Callable[..., Any], fakes: list[Any], tracing: Callable[[], Any]
) -> tuple[str, str, str]:
    """``(op, site, fix)`` for the draw ``op`` the graph holds: the op as torch code
    called it (the graph's may come from its decomposition), `` in <torch module>
    (submodule `path`) of <functd module> at file:line (`code`)`` and the way around.
    Runs ``fn`` once more on the fakes under a dispatch mode that stops at the first
    drawing op: only a refusal pays for finding the site, the trace records no stacks.
    Without a site (the run did not reach the draw): ``(op, "", fix)``."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Called(TorchFunctionMode):  # the torch function the Python code called
        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.func = func
            return func(*args, **(kwargs or {}))

    class _FindDraw(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if draws(func, args, kwargs or {}):
                raise _Draw(func, sys._getframe(1))
            return func(*args, **(kwargs or {}))

    # the trace's fake mode (a function of no tensors: a new one), so nothing runs for real
    mode = next((t.fake_mode for t in fakes if hasattr(t, "fake_mode")), None)
    fake = mode or FakeTensorMode(allow_non_fake_inputs=True)
    called = _Called()
    try:
        with tracing(), torch.enable_grad(), fake, _FindDraw(), called:
            fn(*fakes)
    except _Draw as found:
        site, module = _site(found.frame, fn.__code__)
        name = getattr(getattr(called, "func", None), "__name__", None)
        via = f"{name}(...)" if name else found.op if found.op != op else None
        shown = f"{op}, from {via}" if via else str(op)
        return shown, site, fix(found.op, name, module)
    except Exception:  # the refusal stands; only its site is unknown
        pass
    return str(op), "", fix(op, None, None)


def _site(frame: Any, stop: Any) -> tuple[str, torch.nn.Module | None]:
    """The site's text and the innermost torch module, from the frames between a draw
    and ``stop`` (the traced function's code): the innermost torch module's
    ``forward``, its path in the module a ``FunctionalCall`` runs, the innermost
    functd module, and the innermost line outside torch."""
    # (by their attributes: this room imports neither functd.nn nor the modules room)
    at = torch_module = root = label = None
    while frame is not None and frame.f_code is not stop:
        code, me = frame.f_code, frame.f_locals.get("self")
        if at is None and not code.co_filename.startswith((_TORCH_DIR, __file__)):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            at = f" at {code.co_filename}:{frame.f_lineno} (`{line}`)"
        if torch_module is None and code.co_name == "forward" and isinstance(me, torch.nn.Module):
            torch_module = me
        if root is None and _wraps_torch_module(me):  # fd.nn's FunctionalCall
            root = me.module
        if label is None and callable(getattr(me, "_label", None)):  # a functd module
            label = me._label()
        frame = frame.f_back
    where = []
    if torch_module is not None:
        named = root.named_modules() if root is not None else ()
        path = next((n for n, m in named if m is torch_module and n), None)
        where.append(type(torch_module).__name__ + (f" (submodule `{path}`)" if path else ""))
    if label is not None:
        where.append(f"of {label}" if where else label)
    return (" in " + " ".join(where) if where else "") + (at or ""), torch_module


def _wraps_torch_module(v: Any) -> bool:
    """Whether ``v`` runs a torch module it holds as ``.module`` (fd.nn's
    FunctionalCall), without being one."""
    return isinstance(getattr(v, "module", None), torch.nn.Module) and not isinstance(
        v, torch.nn.Module
    )


def fix(op: Any, called: str | None, module: torch.nn.Module | None) -> str:
    """The way around a draw of ``op`` (from the torch function ``called``, in the
    torch module ``module``)."""
    if called == "scaled_dot_product_attention" or any(
        a.name == "dropout_p" for a in op._schema.arguments
    ):
        return FIX_ATTENTION
    if module is None:
        return FIX_KEYS
    if not module.training:
        return FIX_EVAL_MODULE.format(module=type(module).__name__)
    return FIX_HIDDEN

"""Whether a torch module may draw random numbers when called: ``FunctionalCall.random``.

A module in training mode is not random for that alone (a ResNet's BatchNorm
draws nothing). ``may_draw`` reads each submodule in training mode:

- torch's own modules by kind: dropout with ``p > 0``, ``RReLU``, an RNN's
  inter-layer dropout, ``MultiheadAttention``'s dropout, ``FractionalMaxPool``
  without fixed samples; every other ``torch.*`` module draws nothing;
- a drop-path / stochastic-depth module (its class name says so) whose rate is 0
  draws nothing;
- any other module by the names its ``forward`` (and its hooks, and the Python
  functions and methods they call, a few levels deep) refer to: a name that
  speaks of dropout or random numbers (``dropout``, ``attention_dropout``,
  ``drop_path``, ``rand``, ``bernoulli_``, ``multinomial``, a keyword ``dropout_p=``...)
  makes it random,
  except, in ``forward`` itself, a name of one of its submodules (``self.dropout``:
  that child is read by its kind) or of a rate attribute that is 0.

The reading errs towards random: a module judged random only gets a key it may
not use. One judged not random that draws still raises (the call has no key).

Example:
    >>> may_draw(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    False
    >>> may_draw(torch.nn.Dropout(0.1))
    True
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from typing import Any

from torch import nn

__all__ = ["may_draw"]

_WORDS = ("drop", "rand", "bernoulli", "multinomial", "normal_", "uniform_", "exponential_")
_WORDS_MORE = ("gumbel", "poisson", "rrelu", "noise", "cauchy_", "geometric_")
_DEPTH = 4
_DROPOUTS = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout
)  # fmt: skip


def may_draw(module: nn.Module) -> bool:
    """True when a call of ``module`` in its current modes may draw random numbers
    (see the module docstring for how it is read)."""
    return any(_sub_may_draw(sub) for sub in module.modules() if sub.training)


def _sub_may_draw(sub: nn.Module) -> bool:
    kind = type(sub)
    if kind.__module__.startswith("torch."):
        return _torch_kind(sub)
    if _zero_rate(sub):
        return False
    hooks = [*sub._forward_pre_hooks.values(), *sub._forward_hooks.values()]
    fns = [inspect.unwrap(kind.forward), *hooks]
    return any(
        _random_word(name) and (depth > 0 or not _inert(sub, name))
        for name, depth in _names(fns, sub)
    )


def _inert(sub: nn.Module, name: str) -> bool:
    """``sub.<name>`` is a submodule (read by its own kind) or a rate of 0."""
    if name in sub._modules:
        return True
    attr = vars(sub).get(name)
    return type(attr) in (int, float) and attr == 0


def _torch_kind(sub: nn.Module) -> bool:
    if isinstance(sub, _DROPOUTS):
        return sub.p > 0
    if isinstance(sub, nn.RNNBase):
        return sub.dropout > 0 and sub.num_layers > 1
    if isinstance(sub, nn.MultiheadAttention):
        return bool(sub.dropout > 0)
    if isinstance(sub, nn.FractionalMaxPool2d | nn.FractionalMaxPool3d):
        return sub._random_samples is None
    return isinstance(sub, nn.RReLU)


def _zero_rate(sub: nn.Module) -> bool:
    """A drop-path / stochastic-depth module whose rate is 0 (timm's, HF's, torchvision's)."""
    name = type(sub).__name__.lower()
    if "droppath" not in name and "stochasticdepth" not in name:
        return False
    rates = [getattr(sub, a) for a in ("drop_prob", "p", "drop_rate", "rate") if hasattr(sub, a)]
    return bool(rates) and all(isinstance(r, int | float) and r == 0 for r in rates)


def _random_word(name: str) -> bool:
    low = name.lower()
    return low == "normal" or any(w in low for w in _WORDS) or any(w in low for w in _WORDS_MORE)


def _names(fns: list[Any], owner: nn.Module) -> Iterator[tuple[str, int]]:
    """``(name, depth)`` for the names the code of ``fns`` refers to, following the Python
    functions it calls (module globals, functions ``owner`` holds, methods of its class),
    ``_DEPTH`` levels deep."""
    seen: set[int] = set()
    todo = [(fn, 0) for fn in fns]
    while todo:
        fn, depth = todo.pop()
        fn = inspect.unwrap(fn) if callable(fn) else fn
        code = getattr(fn, "__code__", None)
        if not isinstance(code, types.CodeType):
            yield type(fn).__name__, depth  # a callable object: its class name
            continue
        if id(code) in seen:
            continue
        seen.add(id(code))
        glob = getattr(fn, "__globals__", {})
        for name in _code_names(code):
            yield name, depth
            nxt = _resolve(name, glob, owner) if depth < _DEPTH else None
            if _followed(nxt):
                todo.append((nxt, depth + 1))


def _resolve(name: str, glob: dict[str, Any], owner: nn.Module) -> Any:
    """What ``name`` may be in code run for ``owner``: a module global, a function held
    by the instance (``self.fn = fn``), or a method of its class (read statically: no
    property runs)."""
    got = glob.get(name)
    if got is None:
        got = vars(owner).get(name)
    if got is None:
        got = inspect.getattr_static(type(owner), name, None)
    return got.__func__ if isinstance(got, staticmethod | classmethod) else got


def _code_names(code: types.CodeType) -> Iterator[str]:
    """The global and attribute names of ``code``, and the keyword names of its calls
    (``dropout_p=``), nested functions included."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)
        elif isinstance(const, tuple):
            yield from (c for c in const if isinstance(c, str))


def _followed(obj: Any) -> bool:
    """A Python function or method outside torch (torch's are read by name only)."""
    if not isinstance(obj, types.FunctionType | types.MethodType):
        return False
    module: str = getattr(obj, "__module__", None) or ""
    return module != "torch" and not module.startswith("torch.")

"""``inject_hyperparams``: hyper-parameters as tensors in the optimizer state.

Example:
    >>> opt = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-3)
    >>> state = torch.func.vmap(opt.init)(ensemble_params)           # one state per member
    >>> state = state.set(("hyperparams", "lr"), torch.logspace(-4, -2, 8))
    >>> step = torch.func.vmap(train_step)                           # each member its own lr
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .._td import TensorDict
from . import _checks as C
from . import _listops as L
from ._base import GradientTransformation, transformation


def _values(
    hparams: tuple[Any, ...], stored: TensorDict | None, count, dtype, device
) -> dict[str, Any]:
    out = {}
    for k, v in hparams:
        if callable(v):
            out[k] = v(count.to(dtype))
        elif stored is not None:
            out[k] = stored._data[k]
        else:
            out[k] = torch.as_tensor(v, dtype=dtype, device=device)
    return out


def _init(
    params: TensorDict,
    *,
    name: str,
    factory: Callable[..., Any],
    static: tuple[Any, ...],
    hparams: tuple[Any, ...],
):
    leaves = L.check_params(f"fd.optim.{name}.init", params)
    count = L.new_count(leaves)
    values = _values(hparams, None, count, L.scalar_dtype(leaves), count.device)
    inner = factory(**dict(static), **values)
    return L.state_td(
        {"count": count, "hyperparams": L.state_td(values), "inner_state": inner.init(params)}
    )


def _update(updates, state, params=None, *, name, factory, static, hparams):
    where = f"fd.optim.{name}.update"
    L.check_state(where, state, ("count", "hyperparams", "inner_state"))
    stored = state._data["hyperparams"]
    L.check_state(where + " (opt_state['hyperparams'])", stored, tuple(k for k, _ in hparams))
    count = state._data["count"]
    g, _ = L.checked_leaves(where, "grads", updates)
    values = _values(hparams, stored, count, L.scalar_dtype(g), count.device)
    inner = factory(**dict(static), **values)
    updates, inner_state = inner.update(updates, state._data["inner_state"], params)
    new = {"count": count + 1, "hyperparams": L.state_td(values), "inner_state": inner_state}
    return updates, L.state_td(new)


def inject_hyperparams(
    factory: Callable[..., GradientTransformation], static_args: tuple[str, ...] = ()
) -> Callable[..., GradientTransformation]:
    """Wrap an optimizer factory so its numeric hyper-parameters live in the state.

    ``inject_hyperparams(fd.optim.adam)(lr=1e-3, b1=0.9)`` builds an optimizer whose
    state is ``{"count", "hyperparams": {"lr", "b1"}, "inner_state"}``. Each
    numeric argument you *pass* (defaults stay constants) becomes a tensor in
    ``state["hyperparams"]`` (in the params' floating dtype), and each update uses
    the values found there: replace them to change the learning rate mid-run,
    or give each ensemble member its own under ``vmap``. An argument given as a
    schedule is evaluated at the count each update (its current value is stored
    too, for logging). Booleans and the names in ``static_args`` stay constants.

    Tensor hyper-parameters are not validated (checking values would need a
    sync): keep learning rates >= 0 and betas in [0, 1) yourself.

    Raises:
        TypeError: ``factory`` is not callable, or the arguments do not fit it.
        ValueError: a numeric argument is out of range (checked once, here).

    Example:
        >>> opt = fd.optim.inject_hyperparams(fd.optim.sgd)(lr=0.1, momentum=0.9)
        >>> state = opt.init(params)
        >>> state = state.set(("hyperparams", "lr"), torch.tensor(0.01))
    """
    if isinstance(factory, GradientTransformation):
        raise TypeError(
            "fd.optim.inject_hyperparams takes the factory, not a built optimizer: write "
            "inject_hyperparams(fd.optim.adam)(lr=1e-3), not inject_hyperparams(fd.optim.adam(1e-3))."
        )
    if not callable(factory):
        raise TypeError(
            f"fd.optim.inject_hyperparams takes an optimizer factory such as fd.optim.adam "
            f"(not called), got a {type(factory).__name__}."
        )
    sig = inspect.signature(factory)
    fname = getattr(factory, "__name__", "optimizer")

    @functools.wraps(factory)
    def build(*args: Any, **kwargs: Any) -> GradientTransformation:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"fd.optim.inject_hyperparams({fname}): {e}") from None
        factory(*args, **kwargs)  # validates the numbers once, raises the factory's errors
        static, hparams = [], []  # type: ignore[var-annotated]
        for k, v in bound.arguments.items():
            injected = k not in static_args and (C.is_number(v) or isinstance(v, torch.Tensor))
            injected = injected or (k not in static_args and callable(v))
            (hparams if injected else static).append((k, v))
        return transformation(
            f"inject_hyperparams({fname})",
            _init,
            _update,
            factory=factory,
            static=tuple(static),
            hparams=tuple(hparams),
        )

    return build

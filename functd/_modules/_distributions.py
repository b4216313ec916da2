"""Reading values out of ``torch.distributions`` objects, with explicit PRNG keys.

Four rules pick a value from a distribution (``InteractionType``), with
tensordict's meanings:

- ``RANDOM``: a draw from ``functd.random`` under an explicit key,
  reparameterised where the distribution has ``rsample`` (a Normal's draw is
  ``loc + eps * scale`` with ``eps = fd.random.normal(key, shape)``); torch's
  global generator is never used.
- ``MODE`` / ``MEDIAN`` / ``MEAN``: the distribution's ``mode`` / ``median`` /
  ``mean`` attribute (few torch distributions define ``median``: MEDIAN raises
  NotImplementedError for the others, as tensordict's does).
- ``DETERMINISTIC`` (the default): ``deterministic_sample`` when the
  distribution defines one (tensordict's ``Delta``), else the mode for
  enumerable supports (Categorical, Bernoulli, OneHotCategorical) and the mean
  otherwise; a plain ``TransformedDistribution`` (a tanh-squashed Normal) gives
  its transforms applied to the base's deterministic value (``tanh(loc)``), not
  tensordict's random estimate of the mean.

``set_interaction_type`` sets the default for a block of code (or a decorated
function); a module reads it once, when a call starts, so a compiled function is specialised on (and guarded
by) the value it saw.

Example:
    >>> d = torch.distributions.Normal(torch.zeros(3), torch.ones(3))
    >>> x = draw(d, fd.random.key(0))      # reparameterised: loc + eps * scale
    >>> value(d, InteractionType.DETERMINISTIC, None)  # the mean
    tensor([0., 0., 0.])
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch
from torch import Tensor
from torch import distributions as D

from .. import random as fr
from .._ambient import COMPILED, INTERACTION
from .._td import Key
from .._torch.ops import is_all_true, standard_gamma_grad

__all__ = [
    "SUPPORTED",
    "InteractionType",
    "draw",
    "interaction_type",
    "set_interaction_type",
    "value",
]


class InteractionType(str, Enum):
    """How a probabilistic module gets a value from its distribution.

    ``DETERMINISTIC`` (default): the mode for enumerable supports, the mean
    otherwise (``tanh(loc)``-style for transformed distributions); ``RANDOM``:
    a draw with the call's ``key``; ``MODE``, ``MEDIAN``, ``MEAN``: the
    distribution's attribute of that name. Strings work in any case:
    ``InteractionType("random")``, ``InteractionType.from_str("Mode")``, and
    tensordict's members convert.

    Example:
        >>> InteractionType("RANDOM") is InteractionType.RANDOM
        True
        >>> InteractionType.from_str("Median") is InteractionType.MEDIAN
        True
    """

    DETERMINISTIC = "deterministic"
    RANDOM = "random"
    MODE = "mode"
    MEDIAN = "median"
    MEAN = "mean"

    @classmethod
    def from_str(cls, type_str: str) -> InteractionType:
        """The member whose name is ``type_str``, in any case (tensordict's spelling).

        Raises:
            ValueError: no member has that name.
        """
        return as_interaction(type_str, "InteractionType.from_str")

    @classmethod
    def _missing_(cls, value: object) -> InteractionType | None:
        if isinstance(value, str):
            for member in cls:
                if member.value == value.lower():
                    return member
        return None

    def __repr__(self) -> str:
        return f"InteractionType.{self.name}"


def as_interaction(value: Any, where: str) -> InteractionType:
    """``value`` as an InteractionType (a member or its name), or a clear ValueError."""
    if isinstance(value, InteractionType):
        return value
    try:
        return InteractionType(value)
    except ValueError:
        names = ", ".join(m.name for m in InteractionType)
        raise ValueError(
            f"{where}: unknown interaction type {value!r}; use fd.InteractionType.<NAME> "
            f"with NAME one of {names} (or its name as a string)."
        ) from None


# The default set by set_interaction_type: one value per thread. A threading.local
# (not a ContextVar) because torch.compile reads and guards it; it lives in the base
# room because fd.jit keys its compiled code on it too.
_STATE = INTERACTION


def interaction_type() -> InteractionType | None:
    """The interaction type set by :class:`set_interaction_type`, or None outside one.

    Example:
        >>> with set_interaction_type("random"):
        ...     interaction_type()
        InteractionType.RANDOM
    """
    if torch.compiler.is_dynamo_compiling():  # a value dynamo guards (_ambient.COMPILED)
        return COMPILED.value
    return getattr(_STATE, "value", None)


class set_interaction_type:
    """Set the default interaction type of probabilistic modules inside a ``with`` block
    or a decorated function.

    The value is read once when a module call starts, and an explicit
    ``interaction=`` argument wins over it; each module's
    ``default_interaction_type`` applies outside any block (``None`` restores
    that inside one). The setting is per thread. Under ``torch.compile`` set it
    outside the compiled function: the compiled code is guarded on its value, which
    there is the latest setting made in any thread (dynamo guards no thread-local
    value), so threads that compile under different settings at once are not supported.

    Args:
        type: an ``InteractionType`` or its name; None: each module's default.

    Example:
        >>> with fd.set_interaction_type(fd.InteractionType.RANDOM):
        ...     out = policy(params, td, key=fd.random.key(0))
        >>> @fd.set_interaction_type("mode")
        ... def act(params, td):
        ...     return policy(params, td)
    """

    def __init__(self, type: InteractionType | str | None = InteractionType.DETERMINISTIC):
        self.type = None if type is None else as_interaction(type, "set_interaction_type")
        self._prev: list = []

    def __enter__(self) -> set_interaction_type:
        self._prev.append(getattr(_STATE, "value", None))
        _STATE.value = COMPILED.value = self.type  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        _STATE.value = COMPILED.value = self._prev.pop()

    def __call__(self, fn: Callable) -> Callable:
        """Decorate ``fn``: each call of it runs inside ``with set_interaction_type(type)``."""
        if not callable(fn):
            raise TypeError(
                f"set_interaction_type({self.type!r}) decorates a function, got "
                f"{type(fn).__name__}; use it as `@fd.set_interaction_type(...)` or in a "
                "`with` block."
            )
        it = self.type

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with set_interaction_type(it):
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"set_interaction_type({self.type!r})"


# ------------------------------------------------------------------ sampling
def _delta_type():
    """tensordict's Delta, when tensordict is loaded (functd never imports it)."""
    mod = sys.modules.get("tensordict.nn.distributions.continuous")
    return getattr(mod, "Delta", None)


def _normal(d, key, shape):
    return d.loc + fr.normal(key, shape, d.loc.dtype) * d.scale


def _uniform(d, key, shape):
    return d.low + fr.uniform(key, shape, d.low.dtype) * (d.high - d.low)


def _exponential(d, key, shape):
    return fr.exponential(key, shape, d.rate.dtype) / d.rate


def _laplace(d, key, shape):
    eps = torch.finfo(d.loc.dtype).eps
    u = fr.uniform(key, shape, d.loc.dtype, minval=eps - 1.0, maxval=1.0)
    return d.loc - d.scale * u.sign() * torch.log1p(-u.abs())


def _cauchy(d, key, shape):
    u = fr.uniform(key, shape, d.loc.dtype)
    return d.loc + torch.tan(math.pi * (u - 0.5)) * d.scale


def _mvn(d, key, shape):
    from torch.distributions.multivariate_normal import _batch_mv

    eps = fr.normal(key, shape, d.loc.dtype)
    return d.loc + _batch_mv(d._unbroadcasted_scale_tril, eps)


def _categorical(d, key, shape):
    return fr.categorical(key, d.logits, shape=shape)


def _one_hot(d, key, shape):
    idx = fr.categorical(key, d.logits, shape=shape[:-1])
    return torch.nn.functional.one_hot(idx, shape[-1]).to(d.probs.dtype)


def _one_hot_st(d, key, shape):
    probs = d.probs
    return _one_hot(d, key, shape) + (probs - probs.detach())


def _bernoulli(d, key, shape):
    return fr.bernoulli(key, d.probs, shape).to(d.probs.dtype)


def _std_gamma(key: Tensor, alpha: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Marsaglia-Tsang Gamma(alpha, 1) draws with a fixed number of vectorised rounds
    (no data-dependent loop: vmap/compile safe), with the implicit reparameterisation
    gradient ``dx/dalpha`` that torch's ``rsample`` uses."""
    a = alpha.detach().expand(shape)
    boost = a < 1.0
    a1 = torch.where(boost, a + 1.0, a)
    d = a1 - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    k_z, k_u, k_b = fr.split(key, 3)
    z = fr.normal(k_z, (_GAMMA_ROUNDS, *shape), a.dtype)  # all rounds at once
    u = fr.uniform(k_u, (_GAMMA_ROUNDS, *shape), a.dtype)
    v = (1.0 + c * z) ** 3
    ok = (v > 0) & (torch.log(u) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp_min(1e-30)))
    first = ok.to(torch.int8).argmax(0, keepdim=True)  # the first accepted round
    out = torch.gather(d * v, 0, first).squeeze(0)
    done = ok.any(0)
    out = torch.where(done, out, d)  # (probability < 1e-10 per element)
    u = fr.uniform(k_b, shape, a.dtype)
    out = torch.where(boost, out * u.clamp_min(torch.finfo(a.dtype).tiny) ** (1.0 / a), out)
    out = out.clamp_min(torch.finfo(a.dtype).tiny)
    if not alpha.requires_grad:
        return out
    grad = standard_gamma_grad(a, out)
    return out + (alpha.expand(shape) - a) * grad


_GAMMA_ROUNDS = 8


def _gamma(d, key, shape):
    return _std_gamma(key, d.concentration, shape) / d.rate.expand(shape)


def _beta(d, key, shape):
    k1, k2 = fr.split(key)
    x = _std_gamma(k1, d.concentration1, shape)
    y = _std_gamma(k2, d.concentration0, shape)
    return x / (x + y)


def _dirichlet(d, key, shape):
    g = _std_gamma(key, d.concentration, shape)
    return g / g.sum(-1, keepdim=True)


_SAMPLERS = {
    D.Normal: _normal,
    D.Uniform: _uniform,
    D.Exponential: _exponential,
    D.Laplace: _laplace,
    D.Cauchy: _cauchy,
    D.MultivariateNormal: _mvn,
    D.Categorical: _categorical,
    D.OneHotCategorical: _one_hot,
    D.OneHotCategoricalStraightThrough: _one_hot_st,
    D.Bernoulli: _bernoulli,
    D.Gamma: _gamma,
    D.Chi2: _gamma,
    D.Beta: _beta,
    D.Dirichlet: _dirichlet,
}

#: The distributions ``draw`` supports (plus tensordict's ``Delta``).
SUPPORTED = (
    *(c.__name__ for c in _SAMPLERS),
    "Independent(<supported>)",
    "TransformedDistribution(<supported>, transforms) and its subclasses "
    "(LogNormal, HalfNormal, Gumbel, Kumaraswamy, LogisticNormal, Weibull, Pareto, ...)",
    "tensordict's Delta",
)


class UnsupportedDistribution(TypeError):
    """Raised when ``draw`` has no keyed sampler for a distribution."""


def draw(dist: D.Distribution, key: Tensor, sample_shape: tuple[int, ...] = ()) -> Tensor:
    """A draw from ``dist`` under an explicit ``fd.random`` key (reparameterised where
    ``dist`` has ``rsample``: gradients flow to its parameters).

    Args:
        dist: a supported ``torch.distributions`` object (see ``SUPPORTED``).
        key: one key of shape ``(2,)`` (use ``vmap`` for a batch of keys).
        sample_shape: extra leading sample dims.

    Raises:
        UnsupportedDistribution: no keyed sampler for ``type(dist)``; the message
            lists the supported ones.

    Example:
        >>> draw(D.Normal(torch.zeros(2), torch.ones(2)), fd.random.key(0)).shape
        torch.Size([2])
    """
    keyed = getattr(type(dist), "_keyed_sample", None)  # fd.CompositeDistribution
    if keyed is not None:
        return keyed(dist, key, sample_shape)
    shape = tuple(dist._extended_shape(torch.Size(sample_shape)))
    fn = _SAMPLERS.get(type(dist))
    if fn is not None:
        return fn(dist, key.to(_device(dist)), shape)
    if isinstance(dist, D.Independent):
        return draw(dist.base_dist, key, sample_shape)
    if isinstance(dist, D.TransformedDistribution):
        x = draw(dist.base_dist, key, sample_shape)
        for t in dist.transforms:
            x = t(x)
        return x
    delta = _delta_type()
    if delta is not None and type(dist) is delta:
        return dist.param.expand(shape)  # type: ignore[attr-defined]
    raise UnsupportedDistribution(
        f"cannot draw from {type(dist).__name__} with an explicit key; supported: "
        f"{', '.join(SUPPORTED)}. Use InteractionType.DETERMINISTIC, MODE or MEAN "
        "with this distribution, or build it from supported parts."
    )


def _device(dist: D.Distribution) -> torch.device:
    for name in ("loc", "low", "rate", "logits", "probs", "concentration", "concentration1"):
        v = dist.__dict__.get(name)
        if isinstance(v, Tensor):
            return v.device
    return torch.device("cpu")


# ------------------------------------------------------------------ values
def _deterministic(dist: D.Distribution) -> Tensor:
    if hasattr(type(dist), "deterministic_sample"):
        return dist.deterministic_sample  # type: ignore[attr-defined]
    if isinstance(dist, D.Independent):
        return _deterministic(dist.base_dist)
    if type(dist) is D.TransformedDistribution:
        x = _deterministic(dist.base_dist)
        for t in dist.transforms:
            x = t(x)
        return x
    if getattr(dist, "has_enumerate_support", False):
        return _attr(dist, "mode")
    return _attr(dist, "mean")


def _attr(dist: D.Distribution, name: str) -> Tensor:
    try:
        return getattr(dist, name)
    except (NotImplementedError, AttributeError):
        raise NotImplementedError(
            f"{type(dist).__name__} has no {name}; choose another interaction type "
            "(RANDOM with a key, or DETERMINISTIC)."
        ) from None


def value(
    dist: D.Distribution,
    interaction: InteractionType,
    key: Tensor | None,
    n_empirical_estimate: int = 1000,
) -> Tensor:
    """The value ``interaction`` reads from ``dist`` (a draw under ``key`` for RANDOM).

    MEAN of a distribution without a ``mean`` averages ``n_empirical_estimate``
    keyed draws (as tensordict does with its generator); it then needs ``key``.

    Raises:
        NotImplementedError: the distribution lacks the mode/mean asked for.
        UnsupportedDistribution: RANDOM on a distribution without a keyed sampler.

    Example:
        >>> value(D.Bernoulli(torch.tensor([0.2, 0.9])), InteractionType.DETERMINISTIC, None)
        tensor([0., 1.])
    """
    if interaction is InteractionType.DETERMINISTIC:
        return _deterministic(dist)
    if interaction is InteractionType.RANDOM:
        return draw(dist, key)  # type: ignore[arg-type]
    if interaction is InteractionType.MODE:
        return _attr(dist, "mode")
    if interaction is InteractionType.MEDIAN:
        return _attr(dist, "median")
    try:
        return dist.mean
    except (NotImplementedError, AttributeError):
        if key is None:
            raise NotImplementedError(
                f"{type(dist).__name__} has no mean; InteractionType.MEAN then averages "
                f"{n_empirical_estimate} draws and needs a key: pass key=fd.random.key(0)."
            ) from None
        return draw(dist, key, (n_empirical_estimate,)).mean(0)


def add_suffix(key: Key, suffix: str) -> Key:
    """``"a"`` -> ``"a<suffix>"``; a nested key gets the suffix on its last element."""
    return key + suffix if isinstance(key, str) else (*key[:-1], key[-1] + suffix)


_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


def normal_fast(loc: Any, scale: Any, key: Tensor | None, log_prob: bool):
    """``(value, log_prob)`` of ``Normal(loc, scale)`` (a draw under ``key``, else loc) with
    torch's own validation and formulas, without building the object; None when the
    inputs are not plain same-shape float tensors or fail torch's validation (the
    generic path then raises torch's error)."""
    if not (
        isinstance(loc, Tensor)
        and isinstance(scale, Tensor)
        and loc.shape == scale.shape
        and loc.dtype == scale.dtype
        and loc.dtype.is_floating_point
    ):
        return None
    check = D.Distribution._validate_args  # as torch: validate unless turned off
    # one test of (x == x) & (scale > 0) in all: a draw is NaN where loc is (z is finite)
    x = loc if key is None else loc + fr.normal(key.to(loc.device), loc.shape, loc.dtype) * scale
    if check and not is_all_true((x == x) & (scale > 0)):
        return None
    if not log_prob:
        return x, None
    return x, -((x - loc) ** 2) / (2 * scale**2) - scale.log() - _LOG_SQRT_2PI  # Normal.log_prob

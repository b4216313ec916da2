"""Probabilistic heads: a distribution built from td entries, a value written from it.

``Probabilistic`` reads the distribution's parameters, builds
``distribution_class(**params, **distribution_kwargs)`` and writes a value
(chosen by the interaction type, see ``InteractionType``) and optionally its
log-probability under ``<out_key>_log_prob``. It is a module kind of its own, a
sibling of ``Module`` (``_call.ModuleKind``); ``ProbabilisticSequential``
(``_prob_sequential.py``) chains heads with other modules. The interaction type
travels in the call options, which only the probabilistic kinds read. Heads are
pure: randomness comes from the call's ``key`` (a head at position ``i`` of a
sequence gets ``fold_in(key, i)``). A head over ``fd.CompositeDistribution``
writes one value per component; a head's ``num_samples`` makes the call the
one-sample call vmapped over split keys (see ``functd/_modules/_composite.py``).

Example:
    >>> policy = fd.ProbabilisticSequential(
    ...     fd.Module(nn.GRUCell(4, 8), in_keys=["input", "hidden"], out_keys=["hidden"]),
    ...     fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
    ...     fd.Probabilistic(in_keys=["loc", "scale"], out_keys=["action"],
    ...                      distribution_class=torch.distributions.Normal, return_log_prob=True),
    ... )
    >>> out = policy(params, td)                                  # action == loc
    >>> out = policy(params, td, key=k, interaction=fd.InteractionType.RANDOM)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch import distributions as D

from .. import _errors as E
from .._td import Key, TensorDict, from_parts
from ..random import check_key
from ._call import _NOPE, ModuleKind, Options, bad_td, get_path, missing_input, options
from ._call import apply_with_state as _apply_with_state
from ._composite import CompositeDistribution, many, sample_shape
from ._distributions import (
    InteractionType,
    UnsupportedDistribution,
    as_interaction,
    interaction_type,
    normal_fast,
    value,
)
from ._outputs import _write
from ._prob_args import _freeze, parse_head, write_composite
from ._raised import CAUGHT, in_module
from ._sequential import Sequential

__all__ = ["CompositeDistribution", "Probabilistic"]


def _explicit(interaction: Any, m: Any) -> InteractionType | None:
    """The interaction a call names (checked), or None: the context's, else each
    head's default, is read by the head when it runs."""
    if interaction is None or type(interaction) is InteractionType:
        return interaction
    return as_interaction(interaction, m._label())


class ProbabilisticKind(ModuleKind):
    """What both probabilistic kinds share (``fd.Probabilistic``,
    ``fd.ProbabilisticSequential``): the call option ``interaction=`` (it travels in
    the call options; only these kinds read it) and ``num_samples``: the call is then
    the one-sample step ``draw`` vmapped over ``fd.random.split(key, n)``, and ``run``
    (the step inside another module) refuses, since the sample dims are the whole
    td's. ``draw(params, data, batch_size, opts)`` is the step without that refusal."""

    __slots__ = ()
    probabilistic = True
    option_names = ("interaction",)
    num_samples: tuple[int, ...] | None
    #: why ``run`` refuses a kind with ``num_samples`` (formatted with its label)
    _NESTED_SAMPLES: str

    def draw(self, params: Any, data: dict, bs: torch.Size, opts: Options | None) -> Any:
        """One draw of every head on the working dict (no sample dims)."""
        raise NotImplementedError

    def run(self, params: Any, data: dict, bs: torch.Size, opts: Options | None) -> Any:
        """The step inside another module: ``draw``; refused with ``num_samples``."""
        if self.num_samples is not None:
            raise ValueError(self._NESTED_SAMPLES.format(label=self._label()))
        return self.draw(params, data, bs, opts)

    def call_options(
        self, key: Any = None, interaction: InteractionType | str | None = None
    ) -> Options | None:
        """The options of ``m(params, td, key=..., interaction=...)`` (checked)."""
        if interaction is None:
            return None if key is None else Options(key)
        if type(interaction) is not InteractionType:
            interaction = as_interaction(interaction, self._label())
        return Options(key, interaction)

    def run_td(self, params: Any, td: TensorDict, opts: Options | None) -> TensorDict:
        """One call on ``td``; with ``num_samples``, ``draw`` vmapped over split keys
        (every output gets the sample dims)."""
        ns = self.num_samples
        if ns is None:
            return super().run_td(params, td, opts)
        key = it = None
        if opts is not None:
            key, it = opts.key, opts.interaction
        if key is not None:
            key = check_key(self._label, key, one=True)
        bs = td._batch_size

        def one(k: Any) -> TensorDict:
            data = dict(td._data)
            self.draw(params, data, bs, options(k, it))
            return from_parts(data, bs)

        return many(one, ns, key)

    def apply_with_state(
        self,
        params: TensorDict | None,
        td: TensorDict,
        /,
        *,
        key: Any = None,
        interaction: InteractionType | str | None = None,
    ) -> tuple[TensorDict, TensorDict]:
        """``m(params, td, key=..., interaction=...)`` that also returns the new running
        statistics of its stateful modules (BatchNorm before the head in training
        mode), nested by position like ``params`` (empty for a head alone); see
        ``fd.Sequential.apply_with_state``.

        Raises:
            ValueError: with ``num_samples`` (the call is vmapped over keys).
        """
        if self.num_samples is not None:
            raise ValueError(
                f"{self._label()}.apply_with_state: num_samples vmaps the call over keys; "
                "switch the model to eval mode (fd.nn.eval_mode) or drop num_samples."
            )
        return _apply_with_state(self, params, td, Options(key, _explicit(interaction, self), True))


class Probabilistic(ProbabilisticKind):
    """Build a distribution from td entries and write a value from it (no parameters).

    Args:
        in_keys: the distribution's parameters: a list of keys, each feeding the
            argument named by its last element (``("agent", "loc")`` feeds ``loc``);
            or a dict mapping td keys to argument names (``{"mu": "loc"}``, as
            ``fd.Module``'s dict in_keys; tensordict's dict goes the other way).
        out_keys: the one key the value is written to; for a
            ``fd.CompositeDistribution``, its sample keys (default: the
            ``distribution_map`` keys, renamed by ``name_map``).
        distribution_class: a ``torch.distributions`` class, ``fd.CompositeDistribution``
            (its ``distribution_map``, ``name_map``, ... in ``distribution_kwargs``), or a
            callable taking the parameters as keywords and returning a distribution.
        distribution_kwargs: constant keyword arguments of ``distribution_class``.
        return_log_prob: also write the value's log-probability.
        log_prob_key: where; default ``<out_key>_log_prob`` (suffix on the last
            element of a nested key); with ``composite_lp_aggregate`` the key of the
            summed log-probability (default ``"sample_log_prob"``).
        default_interaction_type: used when neither ``interaction=`` nor
            ``fd.set_interaction_type`` says otherwise.
        n_empirical_estimate: draws averaged by MEAN when the distribution has no mean.
        log_prob_keys: one log-probability key per sample key (a composite's custom keys).
        num_samples: an int (or tuple): the call returns that many values along new
            leading dims of every output (tensordict's layout: the td is expanded to
            ``num_samples + batch_size``); the draws are the one-sample call vmapped over
            ``fd.random.split(key, n).reshape(*num_samples, 2)``.
        composite_lp_aggregate: tensordict's aggregated layout (its
            ``set_composite_lp_aggregate(True)``): a composite writes its per-key
            entries and their sum at ``log_prob_key``, and ``log_prob`` returns the sum.

    Raises:
        ValueError: several out_keys without a composite; a log-prob key colliding
            with a sample or parameter key; an unknown interaction type; a bad
            ``num_samples``.
        TypeError: an argument name the distribution class does not take.

    Example:
        >>> head = fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal,
        ...                         return_log_prob=True)
        >>> out = head(None, td, key=fd.random.key(0), interaction="random")
    """

    __slots__ = (
        "_composite",
        "_dist_kwargs",
        "_dkw",
        "_fn",
        "_names",
        "_normal",
        "composite_lp_aggregate",
        "default_interaction_type",
        "distribution_class",
        "in_keys",
        "log_prob_key",
        "log_prob_keys",
        "n_empirical_estimate",
        "num_samples",
        "out_keys",
        "return_log_prob",
        "sample_key",
        "sample_keys",
    )
    _composite: Any
    _dist_kwargs: Any
    _dkw: Any
    _fn: Any
    _names: Any
    _normal: Any
    composite_lp_aggregate: Any
    default_interaction_type: Any
    distribution_class: Any
    in_keys: Any
    log_prob_key: Any
    log_prob_keys: Any
    n_empirical_estimate: Any
    num_samples: Any
    out_keys: Any
    return_log_prob: Any
    sample_key: Any
    sample_keys: Any

    def __init__(
        self,
        in_keys: Sequence[Key] | Mapping[Key, str] | Key,
        out_keys: Sequence[Key] | Key | None = None,
        distribution_class: Callable[..., D.Distribution] | None = None,
        distribution_kwargs: Mapping[str, Any] | None = None,
        return_log_prob: bool = False,
        log_prob_key: Key | None = None,
        default_interaction_type: InteractionType | str = InteractionType.DETERMINISTIC,
        n_empirical_estimate: int = 1000,
        *,
        log_prob_keys: Sequence[Key] | None = None,
        num_samples: int | Sequence[int] | None = None,
        composite_lp_aggregate: bool = False,
    ) -> None:
        dkw = dict(distribution_kwargs or {})
        agg = bool(composite_lp_aggregate)
        ins, names, samples, lp_keys, lp_key, composite, outs = parse_head(
            in_keys,
            out_keys,
            distribution_class,
            dkw,
            return_log_prob,
            log_prob_key,
            log_prob_keys,
            agg,
        )
        set_ = object.__setattr__
        set_(self, "_fn", distribution_class)
        set_(self, "in_keys", ins)
        set_(self, "out_keys", outs)
        set_(self, "_names", names)
        set_(self, "_composite", composite)
        set_(self, "sample_key", samples[0])
        set_(self, "sample_keys", samples)
        set_(self, "log_prob_key", lp_key if return_log_prob else None)
        set_(self, "log_prob_keys", lp_keys if return_log_prob else ())
        set_(self, "composite_lp_aggregate", agg)
        set_(self, "return_log_prob", bool(return_log_prob))
        set_(self, "distribution_class", distribution_class)
        set_(self, "_dist_kwargs", dkw)
        set_(self, "_dkw", tuple((k, _freeze(v)) for k, v in dkw.items()))
        set_(
            self,
            "default_interaction_type",
            as_interaction(default_interaction_type, self._label()),
        )
        set_(self, "n_empirical_estimate", int(n_empirical_estimate))
        set_(self, "num_samples", sample_shape(num_samples, self._label()))
        normal = None  # (loc key, scale key) of a plain Normal head: a faster path
        if distribution_class is D.Normal and not dkw and sorted(names) == ["loc", "scale"]:
            by_name = dict(zip(names, ins))
            normal = (by_name["loc"], by_name["scale"])
        set_(self, "_normal", normal)
        self._check_names()

    _FROZEN_HINT = "build a new Probabilistic."
    _NESTED_SAMPLES = (
        "{label}: num_samples adds leading sample dims to the whole tensordict, which a "
        "plain fd.Sequential cannot do; call the head alone or put it in a "
        "fd.ProbabilisticSequential."
    )

    # ---------------------------------------------------------------- value
    @property
    def distribution_kwargs(self) -> dict[str, Any]:
        return dict(self._dist_kwargs)

    @property
    def fn(self) -> Callable[..., Any]:
        """The distribution class (or callable) the head builds."""
        return self._fn

    @property
    def has_params(self) -> bool:
        return False

    @property
    def random(self) -> bool:
        """True: a call may draw (it needs a ``key`` under ``InteractionType.RANDOM``)."""
        return True

    @property
    def stateful(self) -> bool:
        return False

    @property
    def out_keys_source(self) -> tuple[Key, ...]:
        return self.out_keys

    def select_out_keys(self, *keys: Key) -> Any:
        raise TypeError(
            f"{self._label()}.select_out_keys: select the outputs of the Sequential that "
            "holds it instead: fd.ProbabilisticSequential(...).select_out_keys(...)."
        )

    def __rshift__(self, other: Any) -> Sequential:
        return Sequential(self, other)

    def _identity(self) -> tuple:
        return (
            self._fn,
            self.in_keys,
            self._names,
            self.out_keys,
            self._dkw,
            self.default_interaction_type,
            self.n_empirical_estimate,
            self.num_samples,
            self.composite_lp_aggregate,
        )

    def _label(self) -> str:
        fn = self._fn
        name = getattr(fn, "__name__", None) or type(fn).__name__
        return f"Probabilistic({'lambda' if name == '<lambda>' else name} -> {E.fmt_key(self.out_keys[0])})"

    def __repr__(self) -> str:
        name = getattr(self._fn, "__name__", None) or type(self._fn).__name__
        ins = dict(zip(self.in_keys, self._names))
        extra = f", distribution_kwargs={self._dist_kwargs}" if self._dist_kwargs else ""
        lp = f", log_prob_keys={list(self.log_prob_keys)!r}" if self.return_log_prob else ""
        if self.composite_lp_aggregate:
            lp += f", log_prob_key={self.log_prob_key!r}, composite_lp_aggregate=True"
        ns = f", num_samples={self.num_samples}" if self.num_samples else ""
        return (
            f"Probabilistic(in_keys={ins}, out_keys={list(self.sample_keys)!r}, "
            f"distribution_class={name}{extra}{lp}{ns}, "
            f"default_interaction_type={self.default_interaction_type!r})"
        )

    def _check_names(self) -> None:
        fn = self._fn
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return
        if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            return
        bad = [n for n in (*self._names, *self._dist_kwargs) if n not in sig.parameters]
        if bad:
            raise TypeError(
                f"{self._label()}: the distribution takes no argument(s) {bad}; it takes "
                f"{[n for n in sig.parameters if n != 'self']}. A list in_key feeds the argument "
                "named by its last element; a dict in_keys maps td keys to argument names, "
                "e.g. {'mu': 'loc'}."
            )

    # ---------------------------------------------------------------- dist
    def _dist(self, data: dict) -> D.Distribution:
        kw = dict(self._dist_kwargs)
        for k, name in zip(self.in_keys, self._names):
            v = data.get(k, _NOPE) if type(k) is str else get_path(data, k)
            if v is _NOPE:
                missing_input(self, k, data)
            kw[name] = v
        try:
            dist = self._fn(**kw)
        except CAUGHT as e:  # (free until raised) the distribution refused its arguments
            new = in_module(self, e, [kw[n] for n in self._names], None)
            if new is None:
                raise
            raise new from e
        if self._composite and isinstance(dist, CompositeDistribution):
            dist._lp_keys = dict(zip(self.sample_keys, self.log_prob_keys))
            if self.composite_lp_aggregate and self.log_prob_key is not None:
                dist.log_prob_key = self.log_prob_key
        return dist

    def get_dist(self, params: TensorDict | None, td: TensorDict) -> D.Distribution:
        """The distribution built from ``td``'s entries (``params`` is unused: None).

        Raises:
            KeyError: a distribution parameter is missing from ``td``.
        """
        if not isinstance(td, TensorDict):
            bad_td(self, params, td)
        return self._dist(td._data)

    def log_prob(self, params: TensorDict | None, td: TensorDict) -> Tensor | TensorDict:
        """The log-probability of ``td[out_key]`` under the distribution built from ``td``;
        for a composite, a TensorDict of the per-key entries (with
        ``composite_lp_aggregate``: their sum, a tensor).

        Raises:
            KeyError: ``td`` lacks the sample or a distribution parameter.
        """
        dist = self.get_dist(params, td)
        if self._composite and isinstance(dist, CompositeDistribution):
            return dist.log_prob(td, aggregate=self.composite_lp_aggregate)
        x = td.get(self.sample_key, None)
        if x is None:
            raise KeyError(
                f"{self._label()}.log_prob: the tensordict lacks the sample "
                f"{E.fmt_key(self.sample_key)} to score; it has {E.fmt_keys(td.keys(True, True))}."
            )
        return dist.log_prob(x)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- call
    # __call__: ModuleKind's; run, run_td and call_options: ProbabilisticKind's
    def draw(self, params: Any, data: dict, bs: torch.Size, opts: Options | None) -> None:
        """One draw on the working dict (the step without the ``num_samples`` check): the
        interaction of ``opts``, else the context's (``fd.set_interaction_type``), else
        the default."""
        it = key = None
        if opts is not None:
            it, key = opts.interaction, opts.key
        if it is None:
            it = interaction_type()
            if it is None:
                it = self.default_interaction_type
        rnd = it is InteractionType.RANDOM
        if rnd or (it is InteractionType.MEAN and key is not None):
            if key is None:
                raise ValueError(
                    f"{self._label()}: InteractionType.RANDOM draws a sample and needs a PRNG "
                    "key: call m(params, td, key=fd.random.key(0)) (split a fresh key per "
                    "step), or use InteractionType.DETERMINISTIC."
                )
            key = check_key(self._label, key, True)
        if (
            self._normal is not None
            and it is not InteractionType.MEDIAN  # (torch's Normal has no median)
            and _fast_normal(self, data, bs, key if rnd else None)
        ):
            return
        dist = self._dist(data)
        try:
            x = value(dist, it, key, self.n_empirical_estimate)
        except (UnsupportedDistribution, NotImplementedError) as e:
            raise type(e)(f"{self._label()} under {it!r}: {e}") from None
        if self._composite:
            write_composite(self, data, bs, dist, x)
            return
        _write(self, data, bs, self.sample_key, x)
        if self.return_log_prob:
            _write(self, data, bs, self.log_prob_key, dist.log_prob(x))


def _fast_normal(m: Probabilistic, data: dict, bs: torch.Size, key: Any) -> bool:
    """The hot path of a plain ``Normal(loc, scale)`` head; False: take the generic path."""
    k_loc, k_scale = m._normal
    loc = data.get(k_loc) if type(k_loc) is str else get_path(data, k_loc)
    scale = data.get(k_scale) if type(k_scale) is str else get_path(data, k_scale)
    out = normal_fast(loc, scale, key, m.return_log_prob)
    if out is None:
        return False
    _write(m, data, bs, m.sample_key, out[0])
    if m.return_log_prob:
        _write(m, data, bs, m.log_prob_key, out[1])
    return True

"""``CompositeDistribution``: named distributions over several td keys, as tensordict 0.15.

A composite is built from a TensorDict of parameters (one sub-td of keyword
arguments per component) and a ``distribution_map`` from (nested) keys to
distribution classes. Its values (``sample(key)``, ``mode``, ``mean``,
``deterministic_sample``) are TensorDicts with one entry per component; its
``log_prob`` takes such a TensorDict and returns tensordict's layout:

- ``log_prob(sample)``: a TensorDict of ``<key>_log_prob`` entries (the suffix on
  the last element of a nested key), tensordict's default
  (``composite_lp_aggregate() == False``); with ``aggregate=True`` one tensor,
  the sum over the components and their event dimensions.
- ``log_prob_composite(sample, include_sum=True)``: the entries and their sum at
  ``log_prob_key`` (default ``"sample_log_prob"``).

functd never mutates: where tensordict's aggregated mode writes into the sample
(``inplace``), these return new values. Randomness comes from an explicit key:
component ``i`` (in ``distribution_map`` order) draws under ``fold_in(key, i)``.

Example:
    >>> params = fd.TensorDict({"cont": {"loc": torch.zeros(3, 4), "scale": torch.ones(3, 4)},
    ...                         "nested": {"disc": {"logits": torch.zeros(3, 10)}}}, [3])
    >>> dist = fd.CompositeDistribution(
    ...     params, {"cont": D.Normal, ("nested", "disc"): D.Categorical})
    >>> x = dist.sample(fd.random.key(0))
    >>> dist.log_prob(x)["nested", "disc_log_prob"].shape
    torch.Size([3])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch import distributions as D

from .. import _errors as E
from .._td import Key, TensorDict
from ..random import fold_in, split
from ._distributions import InteractionType, _deterministic, add_suffix, draw, value
from ._keys import as_keys

__all__ = ["CompositeDistribution"]

#: tensordict's name of the summed log-probability / entropy.
SUM_LOG_PROB = "sample_log_prob"
SUM_ENTROPY = "entropy"


def unravel(key: Any, what: str) -> Key:
    """A key as functd stores it: a str, or a flat tuple of str (tensordict's unravel_key)."""
    return as_keys([key], what)[0]


def write_names(name_map: Mapping | None, names: Sequence[Any]) -> dict[Key, Key]:
    """Each component name -> the key its sample is written under (tensordict's name_map)."""
    flat = {unravel(k, "name_map"): unravel(v, "name_map") for k, v in (name_map or {}).items()}
    out = {}
    for n in names:
        n = unravel(n, "distribution_map")
        out[n] = flat.get(n, n)
    return out


def _td(values: Mapping[Key, Tensor], batch: torch.Size) -> TensorDict:
    out = TensorDict({}, batch)
    for k, v in values.items():
        out = out.set(k, v)
    return out


def _event_sum(lp: Tensor, ndim: int) -> Tensor:
    return lp.flatten(ndim, -1).sum(-1) if lp.ndim > ndim else lp


class CompositeDistribution(D.Distribution, Mapping):
    """Independent named distributions whose values are TensorDicts (tensordict 0.15's class).

    Args:
        params: a TensorDict with, at each name of ``distribution_map``, a sub-td of
            that component's keyword arguments (``{"loc": ..., "scale": ...}``). Its
            batch size is the composite's ``batch_shape``.
        distribution_map: (nested) name -> distribution class or callable.
        name_map: name -> the key its sample is written under (others keep their name).
        extra_kwargs: name -> constant keyword arguments of that component.
        log_prob_key: key of the summed log-probability (``"sample_log_prob"``).
        entropy_key: key of the summed entropy (``"entropy"``).

    Raises:
        KeyError: ``params`` lacks a component's entry.
        TypeError: a component's entry is not a TensorDict of keyword arguments.

    Example:
        >>> dist = fd.CompositeDistribution(params, {"a": D.Normal, "b": D.Bernoulli})
        >>> lp = dist.log_prob_composite(dist.sample(fd.random.key(0)), include_sum=True)
        >>> sorted(lp.keys())
        ['a_log_prob', 'b_log_prob', 'sample_log_prob']
    """

    def __init__(
        self,
        params: TensorDict,
        distribution_map: Mapping[Key, Callable[..., D.Distribution]],
        *,
        name_map: Mapping[Key, Key] | None = None,
        extra_kwargs: Mapping[Key, Mapping[str, Any]] | None = None,
        log_prob_key: Key | None = None,
        entropy_key: Key | None = None,
    ) -> None:
        if not isinstance(params, TensorDict):
            raise TypeError(
                "CompositeDistribution: params must be an fd.TensorDict holding one sub-td of "
                f"keyword arguments per component, got {type(params).__name__}."
            )
        extra = {unravel(k, "extra_kwargs"): v for k, v in (extra_kwargs or {}).items()}
        names = write_names(name_map, list(distribution_map))
        dists = {}
        for raw, cls in distribution_map.items():
            name = unravel(raw, "distribution_map")
            kw = params.get(name, None)
            if kw is None:
                raise KeyError(
                    f"CompositeDistribution: params lack the entry {E.fmt_key(name)} of "
                    f"distribution_map; they have {E.fmt_keys(params.keys(True, True))}."
                )
            if not isinstance(kw, TensorDict):
                raise TypeError(
                    f"CompositeDistribution: params[{E.fmt_key(name)}] must be a TensorDict of "
                    f"keyword arguments of {getattr(cls, '__name__', cls)} (e.g. "
                    f"{{'loc': ..., 'scale': ...}}), got a {type(kw).__name__}."
                )
            dists[names[name]] = cls(**dict(kw.items()), **extra.get(name, {}))  # type: ignore[arg-type]
        self._init(params.batch_size, dists, log_prob_key, entropy_key)

    def _init(self, batch, dists, log_prob_key, entropy_key, lp_keys=None) -> None:
        self._batch_shape = torch.Size(batch)
        self._event_shape = torch.Size(())
        self.dists = dict(dists)
        self.log_prob_key = SUM_LOG_PROB if log_prob_key is None else log_prob_key
        self.entropy_key = SUM_ENTROPY if entropy_key is None else entropy_key
        self._lp_keys = dict(lp_keys or {})  # sample key -> custom log-prob key

    @classmethod
    def from_distributions(
        cls,
        params: TensorDict | Sequence[int],
        distributions: Mapping[Key, D.Distribution],
        *,
        name_map: Mapping[Key, Key] | None = None,
        log_prob_key: Key | None = None,
        entropy_key: Key | None = None,
        _lp_keys: Mapping[Key, Key] | None = None,
    ) -> CompositeDistribution:
        """A composite of built distributions; ``params``: a TensorDict (or a batch size)
        whose batch size is the composite's ``batch_shape``.

        Example:
            >>> d = fd.CompositeDistribution.from_distributions(
            ...     [3], {"a": D.Normal(torch.zeros(3), torch.ones(3))})
        """
        batch = params.batch_size if isinstance(params, TensorDict) else params
        names = write_names(name_map, list(distributions))
        dists = {names[unravel(k, "distributions")]: d for k, d in distributions.items()}
        self = cls.__new__(cls)
        self._init(batch, dists, log_prob_key, entropy_key, _lp_keys)
        return self

    # ------------------------------------------------------------- mapping
    def __getitem__(self, name: Key) -> D.Distribution:
        return self.dists[unravel(name, "name")]

    def __iter__(self) -> Iterator[Key]:
        return iter(self.dists)

    def __len__(self) -> int:
        return len(self.dists)

    def __repr__(self) -> str:
        return f"CompositeDistribution({self.dists})"

    # ------------------------------------------------------------- values
    def sample(self, key: Tensor, sample_shape: Sequence[int] = ()) -> TensorDict:  # type: ignore[override]
        """A TensorDict of draws (batch ``sample_shape + batch_shape``); component ``i``
        draws under ``fold_in(key, i)``, reparameterised where it can be."""
        shape = torch.Size(sample_shape)
        vals = {k: draw(d, fold_in(key, i), shape) for i, (k, d) in enumerate(self.dists.items())}
        return _td(vals, shape + self.batch_shape)

    rsample = sample  # type: ignore[assignment]
    _keyed_sample = sample  # what fd's draw() dispatches to

    def _value(self, it: InteractionType) -> TensorDict:
        return _td({k: value(d, it, None) for k, d in self.dists.items()}, self.batch_shape)

    @property
    def mode(self) -> TensorDict:  # type: ignore[override]
        return self._value(InteractionType.MODE)

    @property
    def mean(self) -> TensorDict:  # type: ignore[override]
        return self._value(InteractionType.MEAN)

    @property
    def deterministic_sample(self) -> TensorDict:
        return _td({k: _deterministic(d) for k, d in self.dists.items()}, self.batch_shape)

    # ------------------------------------------------------------- scores
    def _get(self, sample: TensorDict, k: Key, what: str) -> Tensor:
        x = sample.get(k, None) if isinstance(sample, TensorDict) else None
        if x is None:
            have = E.fmt_keys(sample.keys(True, True)) if isinstance(sample, TensorDict) else "-"
            raise KeyError(
                f"CompositeDistribution.{what}: the tensordict lacks the sample {E.fmt_key(k)}; "
                f"it has {have}. Pass a TensorDict with one entry per component."
            )
        return x  # type: ignore[return-value]

    def log_prob_composite(self, sample: TensorDict, *, include_sum: bool = False) -> TensorDict:
        """A new TensorDict (batch of ``sample``) of ``<key>_log_prob`` entries, and with
        ``include_sum`` their sum over components and event dims at ``log_prob_key``."""
        vals, total = {}, 0.0
        for k, d in self.dists.items():
            lp = d.log_prob(self._get(sample, k, "log_prob"))
            vals[self._lp_keys.get(k, add_suffix(k, "_log_prob"))] = lp
            if include_sum:
                total = total + _event_sum(lp, sample.batch_dims)  # type: ignore[assignment]
        if include_sum:
            vals[self.log_prob_key] = total
        return _td(vals, sample.batch_size)

    def log_prob(self, sample: TensorDict, *, aggregate: bool = False) -> TensorDict | Tensor:  # type: ignore[override]
        """``<key>_log_prob`` entries (a TensorDict), or with ``aggregate`` their sum over the
        components and event dims (a tensor of the sample's batch shape)."""
        if not aggregate:
            return self.log_prob_composite(sample)
        total = 0.0
        for k, d in self.dists.items():
            total = total + _event_sum(  # type: ignore[assignment]
                d.log_prob(self._get(sample, k, "log_prob")), sample.batch_dims
            )
        return total  # type: ignore[return-value]

    def _entropy(self, d: D.Distribution, samples_mc: int, key: Tensor | None) -> Tensor:
        try:
            return d.entropy()
        except NotImplementedError:
            if key is None:
                raise NotImplementedError(
                    f"CompositeDistribution.entropy: {type(d).__name__} has no closed-form "
                    f"entropy; the Monte Carlo estimate needs a key: entropy(key=fd.random.key(0))."
                ) from None
            x = draw(d, key, (samples_mc,))
            return -d.log_prob(x).mean(0)

    def entropy_composite(
        self, samples_mc: int = 1, *, include_sum: bool = False, key: Tensor | None = None
    ) -> TensorDict:
        """A TensorDict of ``<key>_entropy`` entries (and their sum at ``entropy_key``)."""
        vals, total, n = {}, 0.0, len(self.batch_shape)
        for i, (k, d) in enumerate(self.dists.items()):
            e = self._entropy(d, samples_mc, None if key is None else fold_in(key, i))
            vals[add_suffix(k, "_entropy")] = e
            if include_sum:
                total = total + _event_sum(e, n)  # type: ignore[assignment]
        if include_sum:
            vals[self.entropy_key] = total  # type: ignore[assignment]
        return _td(vals, self.batch_shape)

    def entropy(  # type: ignore[override]
        self, samples_mc: int = 1, *, aggregate: bool = False, key: Tensor | None = None
    ) -> TensorDict | Tensor:
        """``<key>_entropy`` entries, or with ``aggregate`` their sum (over event dims too)."""
        td = self.entropy_composite(samples_mc, key=key)
        if not aggregate:
            return td
        n = len(self.batch_shape)
        return sum(_event_sum(e, n) for e in td.values(True, True))  # type: ignore[return-value]


def sample_shape(num_samples: Any, label: str) -> tuple[int, ...] | None:
    """``num_samples`` (None, an int or a sequence of ints) as a shape, or a clear error."""
    if num_samples is None:
        return None
    shape = (num_samples,) if isinstance(num_samples, int) else tuple(num_samples)
    if not shape or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape
    ):
        raise ValueError(
            f"{label}: num_samples must be a positive int (or a tuple of them), got "
            f"{num_samples!r}."
        )
    return shape


def many(call: Callable[[Any], Any], shape: tuple[int, ...], key: Tensor | None) -> Any:
    """``num_samples``: ``call(k)`` vmapped over ``fd.random.split(key, prod(shape))``
    reshaped to ``(*shape, 2)`` (the leading dims of every output); without a key,
    the one (deterministic) output repeated."""
    if key is None:
        args, f = torch.zeros(shape), lambda _: call(None)
    else:
        args, f = split(key, math.prod(shape)).reshape(*shape, *key.shape), call
    for _ in shape:
        f = torch.func.vmap(f)
    return f(args)

"""Argument handling of ``fd.Probabilistic``: keys, composite sample keys, log-prob layout.

Example:
    >>> parse_head(["loc", "scale"], ["a"], D.Normal, {}, True, None, None, False)[3]
    ('a_log_prob',)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import _errors as E
from .._td import Key, TensorDict
from ._composite import SUM_LOG_PROB, CompositeDistribution, write_names
from ._distributions import add_suffix
from ._keys import as_keys
from ._outputs import _write


def _path(key: Key) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else key


def _overlap(a: Key, b: Key) -> bool:
    """a == b, or one lies inside the other."""
    pa, pb = _path(a), _path(b)
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def _freeze(v: Any) -> Any:
    try:
        hash(v)
        return v
    except TypeError:
        if isinstance(v, list | tuple):
            return tuple(_freeze(x) for x in v)
        if isinstance(v, dict):
            return tuple((k, _freeze(x)) for k, x in v.items())
        return ("<id>", id(v))


def composite_sample_keys(dkw: Mapping[str, Any], out_keys: Any) -> tuple[Key, ...]:
    """The sample keys of a composite head: ``distribution_map``'s keys renamed by
    ``name_map``; ``out_keys``, when given, must name the same keys."""
    dmap = dkw.get("distribution_map")
    if not isinstance(dmap, Mapping) or not dmap:
        raise KeyError(
            "Probabilistic: distribution_class=fd.CompositeDistribution needs "
            "distribution_kwargs={'distribution_map': {key: distribution class, ...}}."
        )
    samples = tuple(write_names(dkw.get("name_map"), list(dmap)).values())
    if out_keys is None:
        return samples
    outs = as_keys(out_keys, "out_keys")
    if set(outs) != set(samples) or len(outs) != len(samples):
        raise ValueError(
            f"Probabilistic: out_keys {E.fmt_keys(outs)} are not the composite's sample keys "
            f"{E.fmt_keys(samples)} (distribution_map's keys, renamed by name_map); leave "
            "out_keys out, or list exactly those keys."
        )
    return outs


def log_prob_layout(
    samples: tuple[Key, ...], keys: Any, key: Any, composite: bool, aggregate: bool
) -> tuple[tuple[Key, ...], Key | None]:
    """(one log-prob key per sample key, the single/summed key) in tensordict's layout."""
    if keys is not None and aggregate:
        raise ValueError(
            "Probabilistic: composite_lp_aggregate=True writes the summed log-probability at "
            "log_prob_key; log_prob_keys is for the per-key layout (aggregate False)."
        )
    if key is not None and composite and not aggregate:
        raise ValueError(
            "Probabilistic: a composite writes one log-probability per sample key: pass "
            "log_prob_keys=[...] (or composite_lp_aggregate=True to name their sum with "
            "log_prob_key)."
        )
    if keys is not None:
        lps = as_keys(keys, "log_prob_keys")
        if len(lps) != len(samples):
            raise ValueError(
                f"Probabilistic: log_prob_keys has {len(lps)} keys for {len(samples)} sample "
                f"keys {E.fmt_keys(samples)}; give one per sample key."
            )
        return lps, (lps[0] if len(lps) == 1 else None)
    if composite:
        lps = tuple(add_suffix(k, "_log_prob") for k in samples)
        if not aggregate:
            return lps, None
        return lps, as_keys(SUM_LOG_PROB if key is None else key, "log_prob_key")[0]
    if key is None:
        key = SUM_LOG_PROB if aggregate else add_suffix(samples[0], "_log_prob")
    lp = as_keys(key, "log_prob_key")[0]
    return (lp,), lp


def parse_head(
    in_keys: Any,
    out_keys: Any,
    distribution_class: Any,
    dkw: dict,
    return_log_prob: bool,
    log_prob_key: Any,
    log_prob_keys: Any,
    agg: bool,
) -> tuple:
    """(in_keys, argument names, sample keys, log-prob keys, single/summed log-prob key,
    composite?, out_keys) of a head, or a clear error."""
    if isinstance(in_keys, Mapping):
        ins, names = as_keys(list(in_keys.keys()), "in_keys"), tuple(in_keys.values())
        if not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"Probabilistic: dict in_keys map td keys to argument names (str), got "
                f"{dict(in_keys)!r}."
            )
    else:
        ins = as_keys(in_keys, "in_keys")
        names = tuple(_path(k)[-1] for k in ins)
    if distribution_class is None or not callable(distribution_class):
        raise TypeError(
            f"Probabilistic: distribution_class must be a torch.distributions class or a "
            f"callable returning a distribution, got {distribution_class!r}."
        )
    composite = isinstance(distribution_class, type) and issubclass(
        distribution_class, CompositeDistribution
    )
    if composite:
        samples = composite_sample_keys(dkw, out_keys)
    else:
        if out_keys is None:
            raise TypeError(
                "Probabilistic: out_keys is required (the key the value is written to); "
                "only a fd.CompositeDistribution takes its keys from distribution_map."
            )
        samples = as_keys(out_keys, "out_keys")
        if len(samples) != 1:
            raise ValueError(
                f"Probabilistic writes one sample, but out_keys has {len(samples)} "
                f"({E.fmt_keys(samples)}); use one Probabilistic per sampled key inside a "
                "fd.ProbabilisticSequential, or distribution_class=fd.CompositeDistribution."
            )
    lp_keys, lp_key = log_prob_layout(samples, log_prob_keys, log_prob_key, composite, agg)
    if return_log_prob:
        for lk in (*lp_keys, *((lp_key,) if composite and agg else ())):
            clash = [k for k in (*samples, *ins) if _overlap(lk, k)]
            if clash:
                raise ValueError(
                    f"Probabilistic: log_prob_key {E.fmt_key(lk)} collides with "
                    f"{E.fmt_keys(clash)} (the sample or a distribution parameter): writing "
                    "the log-probability would overwrite it. Choose another log_prob_key, "
                    f"e.g. {E.fmt_key(add_suffix(samples[0], '_log_prob'))}."
                )
    outs = samples
    if return_log_prob:
        outs = (*samples, *lp_keys, *((lp_key,) if composite and agg else ()))
    return ins, names, samples, lp_keys, lp_key, composite, outs


def write_composite(m: Any, data: dict, bs: torch.Size, dist: Any, x: Any) -> None:
    if not isinstance(x, TensorDict):
        raise TypeError(
            f"{m._label()}: distribution_class returned a {type(dist).__name__}, whose value is "
            f"a {type(x).__name__}, not the TensorDict of a fd.CompositeDistribution."
        )
    for k in m.sample_keys:
        _write(m, data, bs, k, x.get(k))
    if m.return_log_prob:
        lp = dist.log_prob_composite(x, include_sum=m.composite_lp_aggregate)
        for k in m.out_keys[len(m.sample_keys) :]:
            _write(m, data, bs, k, lp.get(k))

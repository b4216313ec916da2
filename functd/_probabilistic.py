"""Probabilistic modules: a distribution built from td entries, a value written from it.

``Probabilistic`` reads the distribution's parameters, builds
``distribution_class(**params, **distribution_kwargs)`` and writes a value
(chosen by the interaction type, see ``InteractionType``) and optionally its
log-probability under ``<out_key>_log_prob``. ``ProbabilisticSequential`` is a
``Sequential`` ending in (or holding several) probabilistic heads, with
``get_dist`` and ``log_prob``. Both are pure: randomness comes from the call's
``key`` (a head at position ``i`` of a sequence gets ``fold_in(key, i)``).

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

from . import _errors as E
from . import _plan
from ._distributions import (
    CompositeDistribution,
    InteractionType,
    UnsupportedDistribution,
    add_suffix,
    as_interaction,
    interaction_type,
    normal_fast,
    value,
)
from ._module import (
    Module,
    _bad_td,
    _get_path,
    _missing_input,
    _write,
    as_keys,
    call_td,
)
from ._sequential import Sequential
from ._td import Key, TensorDict, _is_dynamo

__all__ = ["CompositeDistribution", "Probabilistic", "ProbabilisticSequential"]

_NOPE = object()


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


def _check_key_arg(label: str, key: Any) -> None:
    if not isinstance(key, Tensor) or key.dtype not in (torch.int32, torch.uint32):
        what = f"dtype {key.dtype}" if isinstance(key, Tensor) else type(key).__name__
        raise TypeError(
            f"{label}: `key` must be a functd.random key (an int32 tensor of shape (2,)), got "
            f"{what}; make one with fd.random.key(seed)."
        )
    if tuple(key.shape) != (2,):
        raise ValueError(
            f"{label}: `key` must be one key of shape (2,), got shape {tuple(key.shape)}. For "
            "a batch of keys map over them: torch.func.vmap(lambda k: m(params, td, key=k))(keys)."
        )


def _resolve(interaction: Any, m: Any) -> InteractionType | None:
    """The interaction of a call: the explicit argument, else the context's (or None)."""
    if interaction is not None:
        if type(interaction) is InteractionType:
            return interaction
        return as_interaction(interaction, m._label())
    return interaction_type()


class Probabilistic(Module):
    """Build a distribution from td entries and write a value from it (no parameters).

    Args:
        in_keys: the distribution's parameters: a list of keys, each feeding the
            argument named by its last element (``("agent", "loc")`` feeds ``loc``);
            or a dict mapping td keys to argument names (``{"mu": "loc"}``, as
            ``fd.Module``'s dict in_keys; tensordict's dict goes the other way).
        out_keys: the one key the value is written to.
        distribution_class: a ``torch.distributions`` class, or a callable taking the
            parameters as keywords and returning a distribution.
        distribution_kwargs: constant keyword arguments of ``distribution_class``.
        return_log_prob: also write the value's log-probability.
        log_prob_key: where; default ``<out_key>_log_prob`` (suffix on the last
            element of a nested key).
        default_interaction_type: used when neither ``interaction=`` nor
            ``fd.set_interaction_type`` says otherwise.
        n_empirical_estimate: draws averaged by MEAN when the distribution has no mean.

    Raises:
        ValueError: several out_keys; a log-prob key colliding with a sample or
            parameter key; an unknown interaction type.
        TypeError: an argument name the distribution class does not take.

    Example:
        >>> head = fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal,
        ...                         return_log_prob=True)
        >>> out = head(None, td, key=fd.random.key(0), interaction="random")
    """

    __slots__ = (
        "_dist_kwargs",
        "_dkw",
        "_names",
        "_normal",
        "default_interaction_type",
        "distribution_class",
        "log_prob_key",
        "n_empirical_estimate",
        "return_log_prob",
        "sample_key",
    )

    def __init__(
        self,
        in_keys: Sequence[Key] | Mapping[Key, str] | Key,
        out_keys: Sequence[Key] | Key,
        distribution_class: Callable[..., D.Distribution],
        distribution_kwargs: Mapping[str, Any] | None = None,
        return_log_prob: bool = False,
        log_prob_key: Key | None = None,
        default_interaction_type: InteractionType | str = InteractionType.DETERMINISTIC,
        n_empirical_estimate: int = 1000,
    ) -> None:
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
        outs = as_keys(out_keys, "out_keys")
        if len(outs) != 1:
            raise ValueError(
                f"Probabilistic writes one sample, but out_keys has {len(outs)} "
                f"({E.fmt_keys(outs)}); use one Probabilistic per sampled key inside a "
                "fd.ProbabilisticSequential (their distributions form a composite)."
            )
        if not callable(distribution_class):
            raise TypeError(
                f"Probabilistic: distribution_class must be a torch.distributions class or a "
                f"callable returning a distribution, got {distribution_class!r}."
            )
        dkw = dict(distribution_kwargs or {})
        sample_key = outs[0]
        lp_key = None
        if return_log_prob:
            lp_key = as_keys(
                log_prob_key if log_prob_key is not None else add_suffix(sample_key, "_log_prob"),
                "log_prob_key",
            )[0]
            clash = [k for k in (sample_key, *ins) if _overlap(lp_key, k)]
            if clash:
                raise ValueError(
                    f"Probabilistic: log_prob_key {E.fmt_key(lp_key)} collides with "
                    f"{E.fmt_keys(clash)} (the sample or a distribution parameter): writing the "
                    "log-probability would overwrite it. Choose another log_prob_key, e.g. "
                    f"{E.fmt_key(add_suffix(sample_key, '_log_prob'))}."
                )
        set_ = object.__setattr__
        set_(self, "_fn", distribution_class)
        set_(self, "_source", None)
        set_(self, "in_keys", ins)
        set_(self, "out_keys", (sample_key,) if lp_key is None else (sample_key, lp_key))
        set_(self, "_kwargs", names)
        set_(self, "_has_params", False)
        set_(self, "_random", True)
        set_(self, "_kind", -1)
        set_(self, "_plain", None)
        set_(self, "_names", names)
        set_(self, "sample_key", sample_key)
        set_(self, "log_prob_key", lp_key)
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
        set_(self, "_run", self._run_ctx)
        normal = None  # (loc key, scale key) of a plain Normal head: a faster path
        if distribution_class is D.Normal and not dkw and sorted(names) == ["loc", "scale"]:
            by_name = dict(zip(names, ins))
            normal = (by_name["loc"], by_name["scale"])
        set_(self, "_normal", normal)
        self._check_names()

    # ---------------------------------------------------------------- value
    @property
    def distribution_kwargs(self) -> dict[str, Any]:
        return dict(self._dist_kwargs)

    def _identity(self) -> tuple:
        return (
            self._fn,
            self.in_keys,
            self._names,
            self.out_keys,
            self._dkw,
            self.default_interaction_type,
            self.n_empirical_estimate,
        )

    def __eq__(self, other: object) -> bool:
        return type(other) is Probabilistic and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __setattr__(self, name: str, value: Any) -> None:
        raise E.FrozenError(
            f"Probabilistic is immutable: cannot set {name!r}; build a new Probabilistic."
        )

    def _label(self) -> str:
        fn = self._fn
        name = getattr(fn, "__name__", None) or type(fn).__name__
        return f"Probabilistic({'lambda' if name == '<lambda>' else name} -> {E.fmt_key(self.out_keys[0])})"

    def __repr__(self) -> str:
        name = getattr(self._fn, "__name__", None) or type(self._fn).__name__
        ins = dict(zip(self.in_keys, self._names))
        extra = f", distribution_kwargs={self._dist_kwargs}" if self._dist_kwargs else ""
        lp = f", log_prob_key={self.log_prob_key!r}" if self.return_log_prob else ""
        return (
            f"Probabilistic(in_keys={ins}, out_keys=[{self.sample_key!r}], "
            f"distribution_class={name}{extra}{lp}, "
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
            v = data.get(k, _NOPE) if type(k) is str else _get_path(data, k)
            if v is _NOPE:
                _missing_input(self, k, data)
            kw[name] = v
        return self._fn(**kw)

    def get_dist(self, params: TensorDict | None, td: TensorDict) -> D.Distribution:
        """The distribution built from ``td``'s entries (``params`` is unused: None).

        Raises:
            KeyError: a distribution parameter is missing from ``td``.
        """
        if not isinstance(td, TensorDict):
            _bad_td(self, params, td)
        return self._dist(td._data)

    def log_prob(self, params: TensorDict | None, td: TensorDict) -> Tensor:
        """The log-probability of ``td[out_key]`` under the distribution built from ``td``.

        Raises:
            KeyError: ``td`` lacks the sample or a distribution parameter.
        """
        dist = self.get_dist(params, td)
        x = td.get(self.sample_key, None)
        if x is None:
            raise KeyError(
                f"{self._label()}.log_prob: the tensordict lacks the sample "
                f"{E.fmt_key(self.sample_key)} to score; it has {E.fmt_keys(td.keys(True, True))}."
            )
        return dist.log_prob(x)

    # ---------------------------------------------------------------- call
    def __call__(
        self,
        params: TensorDict | None = None,
        td: TensorDict | None = None,
        /,
        *,
        key: Any = None,
        interaction: InteractionType | str | None = None,
        **tensors: Tensor,
    ):
        """``m(params, td, key=None, interaction=None)`` -> new td with the value (and log-prob)."""
        return call_td(self, params, td, key, tensors, self._run_i, _resolve(interaction, self))

    def _run_ctx(self, params: Any, data: dict, bs: torch.Size, key: Any) -> None:
        self._run_i(params, data, bs, key, interaction_type())

    def _run_i(self, params: Any, data: dict, bs: torch.Size, key: Any, it: Any) -> None:
        it = self.default_interaction_type if it is None else it
        rnd = it is InteractionType.RANDOM
        if rnd or (it is InteractionType.MEAN and key is not None):
            if key is None:
                raise ValueError(
                    f"{self._label()}: InteractionType.RANDOM draws a sample and needs a PRNG "
                    "key: call m(params, td, key=fd.random.key(0)) (split a fresh key per "
                    "step), or use InteractionType.DETERMINISTIC."
                )
            if not isinstance(key, Tensor) or key.shape != (2,) or key.dtype != torch.int32:
                _check_key_arg(self._label(), key)
        if self._normal is not None and _fast_normal(self, data, bs, key if rnd else None):
            return
        dist = self._dist(data)
        try:
            x = value(dist, it, key, self.n_empirical_estimate)
        except (UnsupportedDistribution, NotImplementedError) as e:
            raise type(e)(f"{self._label()} under {it!r}: {e}") from None
        _write(self, data, bs, self.sample_key, x)
        if self.return_log_prob:
            _write(self, data, bs, self.log_prob_key, dist.log_prob(x))


def _fast_normal(m: Probabilistic, data: dict, bs: torch.Size, key: Any) -> bool:
    """The hot path of a plain ``Normal(loc, scale)`` head; False: take the generic path."""
    k_loc, k_scale = m._normal
    loc = data.get(k_loc) if type(k_loc) is str else _get_path(data, k_loc)
    scale = data.get(k_scale) if type(k_scale) is str else _get_path(data, k_scale)
    out = normal_fast(loc, scale, key, m.return_log_prob)
    if out is None:
        return False
    _write(m, data, bs, m.sample_key, out[0])
    if m.return_log_prob:
        _write(m, data, bs, m.log_prob_key, out[1])
    return True


def _draws(m: Probabilistic, it: InteractionType | None) -> bool:
    it = m.default_interaction_type if it is None else it
    return it is InteractionType.RANDOM or it is InteractionType.MEAN


def _is_head(m: Any) -> bool:
    return type(m) is Probabilistic


class ProbabilisticSequential(Sequential):
    """A Sequential whose probabilistic heads draw under one interaction type and key.

    Modules compute the distribution parameters; each ``Probabilistic`` head writes
    a value. The call resolves the interaction once (``interaction=``, else
    ``fd.set_interaction_type``, else each head's default) and hands head ``i``
    the key ``fold_in(key, i)``. Parameters nest by position, as in Sequential.

    Args:
        *modules: Modules, Sequentials and at least one ``Probabilistic``.
        selected_out_keys: keep only these outputs (and the inputs).

    Raises:
        TypeError: no ``Probabilistic`` head among the modules.

    Example:
        >>> out = policy(params, td, key=k, interaction=fd.InteractionType.RANDOM)
        >>> dist = policy.get_dist(params, td)
        >>> lp = policy.log_prob(params, out)
    """

    __slots__ = ("_heads", "_psteps")

    def __init__(
        self,
        *modules: Module | Sequential,
        selected_out_keys: Sequence[Key] | None = None,
        _names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(*modules, selected_out_keys=selected_out_keys, _names=_names)
        heads = tuple(i for i, m in enumerate(self.modules) if _is_head(m))
        if not heads:
            raise TypeError(
                "ProbabilisticSequential needs at least one fd.Probabilistic module (the head "
                "that draws from the distribution); without one use fd.Sequential."
            )
        psteps = tuple(
            (n, m, hp, rnd, idx, run, getattr(m, "_run_i", None))
            for n, m, hp, rnd, idx, run in self._steps
        )
        object.__setattr__(self, "_heads", heads)
        object.__setattr__(self, "_psteps", psteps)
        object.__setattr__(self, "_run", self._run_ctx)

    def __eq__(self, other: object) -> bool:
        return type(other) is ProbabilisticSequential and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(("prob", self._identity()))

    def __repr__(self) -> str:
        return "Probabilistic" + super().__repr__()

    def _label(self) -> str:
        return (
            f"ProbabilisticSequential({len(self.modules)} modules -> {E.fmt_keys(self.out_keys)})"
        )

    def __getitem__(self, index: int | slice) -> Sequential:
        mods = self.modules[index] if isinstance(index, slice) else (self.modules[index],)
        names = self.names[index] if isinstance(index, slice) else (self.names[index],)
        cls = ProbabilisticSequential if any(_is_head(m) for m in mods) else Sequential
        return cls(*mods, _names=names)

    def select_out_keys(self, *keys: Key) -> ProbabilisticSequential:
        return ProbabilisticSequential(*self.modules, selected_out_keys=keys, _names=self.names)

    @property
    def default_interaction_type(self) -> InteractionType:
        """The ``default_interaction_type`` of the last head."""
        return self.modules[self._heads[-1]].default_interaction_type

    # ---------------------------------------------------------------- call
    def __call__(
        self,
        params: TensorDict | None = None,
        td: TensorDict | None = None,
        /,
        *,
        key: Any = None,
        interaction: InteractionType | str | None = None,
        **tensors: Tensor,
    ):
        """``policy(params, td, key=None, interaction=None)`` -> new td."""
        it = _resolve(interaction, self)
        if type(td) is TensorDict and not tensors and not _is_dynamo():
            out = _plan.run(self, params, td, key, it)
            if out is not None:
                return out
        return call_td(self, params, td, key, tensors, self._run_i, it)

    def _run_ctx(self, params: Any, data: dict, bs: torch.Size, key: Any) -> None:
        self._run_i(params, data, bs, key, interaction_type())

    def _run_i(self, params, data, bs, key, it, stop: int | None = None, dists=None) -> None:
        """Run the modules on the working dict; ``stop``: before that position, and
        ``dists``: collect each head's distribution (a head keeps a value already there)."""
        pdata = params._data if type(params) is TensorDict else None
        fold_in = None
        for i, (name, m, has_p, rnd, idx, run, run_i) in enumerate(self._psteps):
            if i == stop:
                return
            p = self._child_params(params, pdata, name, m) if has_p else None
            k = key
            if run_i is not None and type(m) is Probabilistic and not _draws(m, it):
                k = None  # a head that will not draw: no key to derive
            elif rnd and key is not None:
                if fold_in is None:
                    from .random import fold_in
                k = fold_in(key, idx)
            if dists is not None and _is_head(m):
                dists[m.sample_key] = (m, m._dist(data), k)
                if m.sample_key in data or i == stop - 1:
                    continue
            if run_i is not None:
                run_i(p, data, bs, k, it)
            else:
                run(p, data, bs, k)
        if stop is None and dists is None:
            self._drop_unselected(data)

    def get_dist(
        self,
        params: TensorDict | None,
        td: TensorDict,
        *,
        key: Any = None,
        interaction: InteractionType | str | None = None,
    ) -> D.Distribution | CompositeDistribution:
        """The distribution of the head (one head), or a ``CompositeDistribution`` over the
        heads' sample keys (several). Modules run as in a call; a head whose sample is
        already in ``td`` keeps it (so later heads condition on it), else draws it with
        ``interaction`` (and ``key`` when RANDOM).

        Raises:
            KeyError, TypeError: as a call does (missing entries, bad params).
        """
        it = _resolve(interaction, self)
        if not isinstance(td, TensorDict):
            _bad_td(self, params, td)
        data = dict(td._data)
        if len(self._heads) == 1:
            self._run_i(params, data, td._batch_size, key, it, stop=self._heads[0])
            return self.modules[self._heads[0]]._dist(data)
        dists: dict = {}
        self._run_i(params, data, td._batch_size, key, it, stop=self._heads[-1] + 1, dists=dists)
        return CompositeDistribution(
            {k: d for k, (_, d, _) in dists.items()},
            td._batch_size,
            {k: (m.log_prob_key or add_suffix(k, "_log_prob")) for k, (m, _, _) in dists.items()},
        )

    def log_prob(
        self,
        params: TensorDict | None,
        td: TensorDict,
        *,
        key: Any = None,
        interaction: InteractionType | str | None = None,
    ) -> Tensor | TensorDict:
        """The log-probability of the sample(s) in ``td``: a tensor for one head; for
        several, a TensorDict of each head's ``<key>_log_prob`` (log p of later heads is
        conditional on the earlier samples in ``td``).

        Raises:
            KeyError: ``td`` lacks a sample to score.
        """
        dist = self.get_dist(params, td, key=key, interaction=interaction)
        if isinstance(dist, CompositeDistribution):
            return dist.log_prob(td)
        return dist.log_prob(_sample_of(self.modules[self._heads[0]], td))


def _sample_of(head: Probabilistic, td: TensorDict) -> Tensor:
    x = td.get(head.sample_key, None)
    if x is None:
        raise KeyError(
            f"{head._label()}.log_prob: the tensordict lacks the sample "
            f"{E.fmt_key(head.sample_key)} to score; it has {E.fmt_keys(td.keys(True, True))}."
        )
    return x

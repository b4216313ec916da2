"""ProbabilisticSequential: a sequence whose probabilistic heads draw under one
interaction type and key.

A sibling of ``fd.Sequential`` (both ``SequenceKind``s: one child loop, one plan
generator) and of ``fd.Probabilistic`` (both ``ProbabilisticKind``s: the
``interaction=`` option and ``num_samples``). It adds ``get_dist`` and
``log_prob``.

Example:
    >>> policy = fd.ProbabilisticSequential(
    ...     fd.Module(nn.Linear(3, 4), in_keys=["x"], out_keys=["h"]),
    ...     fd.Module(fd.NormalParamExtractor(), in_keys=["h"], out_keys=["loc", "scale"]),
    ...     fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal),
    ... )
    >>> out = policy(params, td, key=k, interaction=fd.InteractionType.RANDOM)
    >>> lp = policy.log_prob(params, out)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor
from torch import distributions as D

from .. import _errors as E
from .._td import Key, TensorDict
from ._call import _NOPE, ModuleKind, Options, bad_td, get_path
from ._composite import CompositeDistribution
from ._distributions import InteractionType
from ._probabilistic import Probabilistic, ProbabilisticKind, _explicit
from ._sequential import SequenceKind

__all__ = ["ProbabilisticSequential"]


class ProbabilisticSequential(ProbabilisticKind, SequenceKind):
    """A Sequential whose probabilistic heads draw under one interaction type and key.

    Modules compute the distribution parameters; each ``Probabilistic`` head writes
    a value. The call resolves the interaction once (``interaction=``, else
    ``fd.set_interaction_type``, else each head's default) and hands head ``i``
    the key ``fold_in(key, i)``. Parameters nest by position, as in Sequential.

    Args:
        *modules: Modules, Sequentials and at least one ``Probabilistic``.
        selected_out_keys: keep only these outputs (and the inputs).
        return_composite: what ``get_dist`` returns: True, a ``fd.CompositeDistribution``
            over every head's sample keys; False, the last module's distribution (it
            must be a head). Default (None): True with several heads or when the last
            module is not a head, as tensordict.

    A head with ``num_samples=n`` makes the call the one-sample call vmapped over
    ``fd.random.split(key, n)``: every output gets the leading dim, and the other
    random modules draw per sample too (tensordict draws the modules before the
    head once); at most one head may set it.

    Raises:
        TypeError: no ``Probabilistic`` head among the modules; return_composite=False
            with a last module that is not a head.
        ValueError: several heads with ``num_samples``.

    Example:
        >>> out = policy(params, td, key=k, interaction=fd.InteractionType.RANDOM)
        >>> dist = policy.get_dist(params, td)
        >>> lp = policy.log_prob(params, out)
    """

    __slots__ = ("_heads", "num_samples", "return_composite")
    _heads: Any
    num_samples: Any  # the num_samples of its head (at most one sets it), or None
    return_composite: Any
    _FROZEN_HINT = "select_out_keys(...) and indexing return new ProbabilisticSequentials."
    _NESTED_SAMPLES = (
        "{label}: a head's num_samples adds leading sample dims to the whole tensordict; "
        "call the ProbabilisticSequential itself, not through an outer module."
    )

    def __init__(
        self,
        *modules: ModuleKind,
        selected_out_keys: Sequence[Key] | None = None,
        return_composite: bool | None = None,
        _names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(*modules, selected_out_keys=selected_out_keys, _names=_names)
        heads = tuple(i for i, m in enumerate(self.modules) if isinstance(m, Probabilistic))
        if not heads:
            raise TypeError(
                "ProbabilisticSequential needs at least one fd.Probabilistic module (the head "
                "that draws from the distribution); without one use fd.Sequential."
            )
        last_is_head = heads[-1] == len(self.modules) - 1
        if return_composite is None:
            return_composite = len(heads) > 1 or not last_is_head
        elif not return_composite and not last_is_head:
            raise TypeError(
                "ProbabilisticSequential(return_composite=False): get_dist returns the last "
                "module's distribution, but the last module is not a fd.Probabilistic; end with "
                "the head, or use return_composite=True."
            )
        ns = [self.modules[i].num_samples for i in heads if self.modules[i].num_samples]
        if len(ns) > 1:
            raise ValueError(
                f"{self._label()}: {len(ns)} heads set num_samples; set it on one head (the "
                "call is the one-sample call vmapped over split keys)."
            )
        object.__setattr__(self, "return_composite", bool(return_composite))
        object.__setattr__(self, "num_samples", ns[0] if ns else None)
        object.__setattr__(self, "_heads", heads)

    def _identity(self) -> tuple:
        return (*super()._identity(), self.return_composite)

    def child_step(self, m: ModuleKind) -> Any:
        """A head draws (one sample: with ``num_samples`` the call vmaps the loop)."""
        return m.draw if isinstance(m, Probabilistic) else m.run

    def _rebuild(self, modules: Any, selected: Any, names: Any) -> SequenceKind:
        return ProbabilisticSequential(
            *modules,
            selected_out_keys=selected,
            return_composite=self.return_composite,
            _names=names,
        )

    def __repr__(self) -> str:
        return "Probabilistic" + super().__repr__()

    def _part(self, mods: Sequence[ModuleKind], names: Sequence[str]) -> SequenceKind:
        """tensordict's rule for a slice or sub-sequence: with ``return_composite`` and a
        probabilistic module among ``mods``, a composite ProbabilisticSequential; else one
        when the last module is probabilistic; else a plain ``fd.Sequential``."""
        if self.return_composite and any(m.probabilistic for m in mods):
            new = ProbabilisticSequential(*mods, return_composite=True, _names=names)
        elif mods[-1].probabilistic:
            new = ProbabilisticSequential(*mods, _names=names)
        else:
            return super()._part(mods, names)
        return new._takes_params_of(self)

    @property
    def default_interaction_type(self) -> InteractionType:
        """The ``default_interaction_type`` of the last head."""
        return self.modules[self._heads[-1]].default_interaction_type

    # ---------------------------------------------------------------- call
    # __call__: ModuleKind's; run, run_td, call_options: ProbabilisticKind's, whose
    # run_td goes on to SequenceKind's (the plan) without num_samples
    #: one draw of every head: the child loop
    draw = SequenceKind.run

    def get_dist(
        self,
        params: TensorDict | None,
        td: TensorDict,
        *,
        key: Any = None,
        interaction: InteractionType | str | None = None,
    ) -> D.Distribution | CompositeDistribution:
        """The last head's distribution (``return_composite=False``), or a
        ``CompositeDistribution`` over every head's sample keys (True; a composite
        head's components are merged in). Modules run as in a call; a head whose
        sample is already in ``td`` keeps it (so later heads condition on it), else
        draws it with ``interaction`` (and ``key`` when RANDOM).

        Raises:
            KeyError, TypeError: as a call does (missing entries, bad params).
        """
        opts = Options(key, _explicit(interaction, self), True)
        if not isinstance(td, TensorDict):
            bad_td(self, params, td)
        data, bs = dict(td._data), td._batch_size
        if not self.return_composite and len(self._heads) == 1:
            self.run_children(params, data, bs, opts, stop=self._heads[0])
            return self.modules[self._heads[0]]._dist(data)
        dists: dict = {}
        stop = self._heads[-1] + 1

        def visit(i: int, m: Any, data: dict, o: Any) -> bool:
            """Collect each head's distribution; a head keeps a value already there."""
            if not isinstance(m, Probabilistic):
                return False
            dists[i] = (m, m._dist(data), o)
            return _has_samples(m, data) or i == stop - 1

        self.run_children(params, data, bs, opts, stop=stop, visit=visit)
        if not self.return_composite:
            return list(dists.values())[-1][1]  # (the last head's)
        merged, lp_keys = {}, {}
        for m, d, _ in dists.values():
            if isinstance(d, CompositeDistribution):
                merged.update(d.dists)
                lp_keys.update(d._lp_keys)
            else:
                merged[m.sample_key] = d
                if m.return_log_prob and not m.composite_lp_aggregate:
                    lp_keys[m.sample_key] = m.log_prob_key
        return CompositeDistribution.from_distributions(bs, merged, _lp_keys=lp_keys)

    def log_prob(
        self,
        params: TensorDict | None,
        td: TensorDict,
        *,
        key: Any = None,
        interaction: InteractionType | str | None = None,
        aggregate: bool | None = None,
    ) -> Tensor | TensorDict:
        """The log-probability of the sample(s) in ``td``: a tensor for the last head's
        distribution; for a composite, a TensorDict of each sample's ``<key>_log_prob``
        (the keys a call writes), or their sum with ``aggregate`` (default: the last
        head's ``composite_lp_aggregate``). Log p of later heads is conditional on the
        earlier samples in ``td``.

        Raises:
            KeyError: ``td`` lacks a sample to score.
        """
        dist = self.get_dist(params, td, key=key, interaction=interaction)
        if isinstance(dist, CompositeDistribution):
            last = self.modules[self._heads[-1]]
            return dist.log_prob(
                td, aggregate=last.composite_lp_aggregate if aggregate is None else aggregate
            )
        return dist.log_prob(_sample_of(self.modules[self._heads[-1]], td))


def _has_samples(head: Probabilistic, data: dict) -> bool:
    for k in head.sample_keys:
        v = data.get(k, _NOPE) if type(k) is str else get_path(data, k)
        if v is _NOPE:
            return False
    return True


def _sample_of(head: Probabilistic, td: TensorDict) -> Tensor:
    x = td.get(head.sample_key, None)
    if x is None:
        raise KeyError(
            f"{head._label()}.log_prob: the tensordict lacks the sample "
            f"{E.fmt_key(head.sample_key)} to score; it has {E.fmt_keys(td.keys(True, True))}."
        )
    return x  # type: ignore[return-value]

"""A Module's step, described once: what it reads, how it calls, what it checks and writes.

``Step`` is the one description of a ``fd.Module``'s step. Two consumers read
it and nothing else of the Module: ``run_step`` (the reference: the step the
child loop runs on a working dict) and the plan generator (``_plan.py``, which
writes the same step out as straight-line code when ``inlinable(step)``). A
change to how a Module reads, calls, checks its params or writes its outputs is
made here (or in ``_outputs.py`` / ``_params_check.py``, which both use).

The call has one of four forms (``Form``): ``PLAIN`` ``fn(*args)`` (a function
without params), ``LAYER`` ``fn(params, *args)``, ``EMPTY`` ``fn(empty, *args)`` (a
layer without params) and ``KEYWORDS`` ``fn(**{name: arg})``; ``key`` says whether
``key=`` is passed. A layer bound by keyword (``_binding.py``) is described as a
``LAYER`` call of its binding.

Example:
    >>> fd.Module(torch.relu, ["x"], ["y"])._desc.form
    <Form.PLAIN: 'plain'>
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import torch

from .. import _errors as E
from .._td import EMPTY, Key, TensorDict
from ._binding import raise_held
from ._call import _NOPE, bad_params, get_path, missing_input
from ._outputs import _write_outputs
from ._params_check import placed_inputs
from ._raised import CAUGHT, in_module

__all__ = ["Form", "Step", "inlinable", "run_step"]


class Form(enum.Enum):
    """How a step calls its function (see the module docstring)."""

    PLAIN = "plain"
    LAYER = "layer"
    EMPTY = "empty"
    KEYWORDS = "keywords"


class Step(NamedTuple):
    """What one Module does. ``fn`` is called in ``form``; ``token`` is the layer its
    params are checked against (None: no params); ``held``: params paths that must not
    require grad; ``writes``: every output ``fn`` returns, ``keep`` the ones written;
    ``same_shape``: the one output has its one input's shape (elementwise); ``inline``:
    the layer's own ``plan_inline`` (``nn._base.Inline``) when the plan may write its
    call out, else None."""

    reads: tuple[Key, ...]
    fn: Any
    form: Form
    key: bool
    names: tuple[str, ...] | None
    token: Any
    held: tuple
    writes: tuple[Key, ...]
    keep: tuple[Key, ...]
    stateful: bool
    same_shape: bool
    inline: Any = None


def inlinable(s: Step) -> bool:
    """Whether the plan may write ``s`` out: str keys, every output written, no state and
    no held-out params (their checks stay in ``run_step``)."""
    return (
        not s.stateful
        and not s.held
        and s.writes == s.keep
        and all(type(k) is str for k in s.reads)
        and all(type(k) is str for k in s.writes)
    )


def read(m: Any, s: Step, data: dict) -> list:
    """The step's inputs from the working dict (a clear error for a missing one)."""
    args = []
    for k in s.reads:
        v = data.get(k, _NOPE) if type(k) is str else get_path(data, k)  # type: ignore[arg-type]
        if v is _NOPE:
            missing_input(m, k, data)
        args.append(v)
    return args


def call(s: Step, p: Any, args: Any, key: Any) -> Any:
    """Call ``s.fn`` in its form with params ``p`` (a checked TensorDict, or None)."""
    form = s.form
    if form is Form.PLAIN:
        return s.fn(*args)
    if form is Form.KEYWORDS:
        return s.fn(**dict(zip(s.names, args)))  # type: ignore[arg-type]
    if form is Form.EMPTY:
        p = EMPTY
    return s.fn(p, *args, key=key) if s.key else s.fn(p, *args)


def checked_params(m: Any, s: Step, params: Any, args: list) -> list:
    """Check ``params`` against ``s.token`` (once per params TensorDict: the cache of
    ``_td/_marks.py``); returns ``args``, replicated when the params hold DTensors."""
    if type(params) is not TensorDict:
        bad_params(m, params)
    if params._check_cache is not s.token:
        args = placed_inputs(m, params, args)
    if s.held:
        raise_held(m, params)
    return args


def run_step(
    m: Any, s: Step, params: Any, data: dict, bs: torch.Size, opts: Any
) -> TensorDict | None:
    """The reference step: read from the working dict ``data``, check, call, write into
    it; return the new running statistics of a stateful layer (``opts.collect``). An error
    the call raises is re-raised naming the module and its inputs (``_raised.py``)."""
    if s.stateful and (opts is None or not opts.collect):
        raise RuntimeError(E.STATE_DROPPED.format(label=m._label(), what="it"))
    args = read(m, s, data)
    if s.token is not None:
        args = checked_params(m, s, params, args)
    try:
        out = call(s, params, args, None if opts is None else opts.key)
    except CAUGHT as e:  # (free until raised) torch's error, naming the module
        new = in_module(m, e, args, params)
        if new is None:
            raise
        raise new from e
    if s.stateful:
        out, state = out
        _write_outputs(m, data, bs, out)
        return state
    _write_outputs(m, data, bs, out)
    return None

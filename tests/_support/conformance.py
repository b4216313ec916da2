"""The conformance registry: every public module with a factory and an example input.

``ENTRIES`` maps a name to an ``Entry``; the property tests in
``test_conformance.py`` (and later the transform tests) run over all of them.
``PUBLIC`` lists every public module class; a test fails when one has no entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

import functd as fd
from functd._modules._call import ModuleKind
from tests._support.nn_cases import LAYER_CASES

B = 4


@dataclasses.dataclass(frozen=True)
class Entry:
    covers: type  # the public class this entry exercises
    make: Callable[[], fd.Module | fd.Sequential]
    example: Callable[[], fd.TensorDict]  # batch_size [B]
    float_inputs: bool = True  # False: integer inputs (Embedding) are not cast


class _Custom(nn.Module):
    """A torch module functd does not lower: it runs through functional_call."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return torch.tanh(x @ self.w) * self.scale


def _adapt(layer):
    """A whole-sequence RNN/GRU/LSTM with its states' batch dim in front
    (``batch_first_state``), as ``fd.Module`` writes them into a TensorDict."""
    recurrent = (fd.nn.RNN, fd.nn.GRU, fd.nn.LSTM)
    if isinstance(layer, recurrent):
        return dataclasses.replace(layer, batch_first_state=True)
    return layer


def _layer_entry(name: str) -> Entry:
    base, inputs = LAYER_CASES[name]
    covers = type(base())

    def factory():
        return _adapt(base())

    layer = factory()
    in_keys = [f"in{i}" for i in range(len(inputs()))]
    probe = layer(layer.init(0), *inputs(), key=fd.random.key(0)) if layer.random else None
    if probe is None:
        probe = layer(layer.init(0), *inputs())
    n_out = len(tree_leaves(probe))  # LSTM's (out, (h, c)): 3, as fd.Module flattens it
    out_keys = [f"out{i}" for i in range(n_out)]

    def example():
        g = torch.Generator().manual_seed(0)
        xs = inputs()
        xs = [torch.randn(x.shape, generator=g) if x.is_floating_point() else x for x in xs]
        return fd.TensorDict(dict(zip(in_keys, xs)), [B])

    return Entry(
        covers=covers,
        make=lambda: fd.Module(factory(), in_keys, out_keys),
        example=example,
        float_inputs=not name.startswith("Embedding"),
    )


def _x():
    return fd.TensorDict({"x": torch.randn(B, 3)}, [B])


def _x33():
    return fd.TensorDict({"x": torch.randn(B, 3, 3)}, [B])


def _bn_block():
    return fd.Sequential(
        fd.Module(nn.Linear(3, 3), ["x"], ["h"]),
        fd.Module(nn.BatchNorm1d(3, momentum=None), ["h"], ["h"]),
        fd.Module(torch.tanh, ["h"], ["y"]),
    )


def _tutorial_block():
    return fd.Sequential(
        fd.Module(nn.Linear(3, 8), ["x"], ["linear0"]),
        fd.Module(torch.relu, ["linear0"], ["relu0"]),
        fd.Module(nn.Linear(8, 3), ["relu0"], ["linear1"]),
        fd.Module(lambda x, y: x + y, ["x", "linear1"], ["y"]),
    )


ENTRIES: dict[str, Entry] = {name: _layer_entry(name) for name in LAYER_CASES}
ENTRIES.update(
    {
        "Module(callable)": Entry(fd.Module, lambda: fd.Module(torch.tanh, ["x"], ["y"]), _x),
        "Module(nn.Linear lowered)": Entry(
            fd.Module, lambda: fd.Module(nn.Linear(3, 2), ["x"], ["y"]), _x
        ),
        "Module(functional_call)": Entry(fd.Module, lambda: fd.Module(_Custom(), ["x"], ["y"]), _x),
        "Sequential(tutorial block)": Entry(fd.Sequential, _tutorial_block, _x),
        "Sequential(selected)": Entry(
            fd.Sequential, lambda: _tutorial_block().select_out_keys("y"), _x
        ),
        # stateful (BatchNorm in training mode): the laws call apply_with_state; x is
        # (B, 3, 3) so that each sample is itself a valid (N=3, C=3) batch
        "Module(BatchNorm1d training)": Entry(
            fd.Module, lambda: fd.Module(nn.BatchNorm1d(3), ["x"], ["y"]), _x33
        ),
        "Sequential(Linear, BatchNorm1d training)": Entry(fd.Sequential, _bn_block, _x33),
    }
)


# -- probabilistic modules (issue 4)
def _normal_params():
    g = torch.Generator().manual_seed(0)
    loc, scale = torch.randn(B, 3, generator=g), torch.rand(B, 3, generator=g) + 0.5
    return fd.TensorDict({"loc": loc, "scale": scale}, [B])


def _gru_input():
    g = torch.Generator().manual_seed(0)
    return fd.TensorDict(
        {"input": torch.randn(B, 4, generator=g), "hidden": torch.randn(B, 8, generator=g)}, [B]
    )


def _gru_policy(interaction="deterministic"):
    return fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(4, 8), ["input", "hidden"], ["hidden"]),
        fd.Module(fd.NormalParamExtractor(), ["hidden"], ["loc", "scale"]),
        fd.Probabilistic(
            ["loc", "scale"],
            ["action"],
            torch.distributions.Normal,
            return_log_prob=True,
            default_interaction_type=interaction,
        ),
    )


def _composite_split(h):
    return h[..., :3], torch.nn.functional.softplus(h[..., 3:6]) + 0.1, h[..., 6:]


def _composite_policy():
    keys = [("params", "cont", "loc"), ("params", "cont", "scale"), ("params", "disc", "logits")]
    dmap = {"cont": torch.distributions.Normal, "disc": torch.distributions.Categorical}
    return fd.ProbabilisticSequential(
        fd.Module(nn.Linear(3, 10), ["x"], ["h"]),
        fd.Module(_composite_split, ["h"], keys),
        fd.Probabilistic(
            ["params"],
            None,
            fd.CompositeDistribution,
            {"distribution_map": dmap},
            return_log_prob=True,
            default_interaction_type="random",
        ),
    )


ENTRIES.update(
    {
        "Probabilistic(Normal, random)": Entry(
            fd.Probabilistic,
            lambda: fd.Probabilistic(
                ["loc", "scale"],
                ["action"],
                torch.distributions.Normal,
                return_log_prob=True,
                default_interaction_type="random",
            ),
            _normal_params,
        ),
        "Probabilistic(Independent Normal)": Entry(
            fd.Probabilistic,
            lambda: fd.Probabilistic(
                ["loc", "scale"],
                ["action"],
                lambda loc, scale: torch.distributions.Independent(
                    torch.distributions.Normal(loc, scale), 1
                ),
                return_log_prob=True,
            ),
            _normal_params,
        ),
        "ProbabilisticSequential(GRU policy)": Entry(
            fd.ProbabilisticSequential, _gru_policy, _gru_input
        ),
        "ProbabilisticSequential(GRU policy, random)": Entry(
            fd.ProbabilisticSequential, lambda: _gru_policy("random"), _gru_input
        ),
        # composite head (issue 13): a Normal and a nested Categorical from one Linear
        "ProbabilisticSequential(composite head, random)": Entry(
            fd.ProbabilisticSequential, _composite_policy, lambda: _x()
        ),
        "Module(NormalParamExtractor)": Entry(
            fd.NormalParamExtractor,
            lambda: fd.Module(fd.NormalParamExtractor(), ["x"], ["loc", "scale"]),
            lambda: fd.TensorDict({"x": torch.randn(B, 6)}, [B]),
        ),
    }
)


# -- a user-defined module kind (issue 14): the calling protocol alone
class Residual(ModuleKind):
    """``y = x + body(x)``: a kind with one child, written with the protocol only
    (no functd internals beyond ``ModuleKind``): the registry sweeps, eval_mode and
    the state helpers must work through it."""

    __slots__ = ("body", "in_keys", "out_keys")

    def __init__(self, body, x="x", y="y"):
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "in_keys", (x,))
        object.__setattr__(self, "out_keys", (y,))

    def _identity(self):
        return (self.body, self.in_keys, self.out_keys)

    def children(self):
        return (("body", self.body),)

    def with_children(self, children):
        (body,) = children
        return Residual(body, *self.in_keys, *self.out_keys)

    def run(self, params, data, bs, opts):
        x = data[self.in_keys[0]]
        p = params["body"] if self.body.has_params else None
        state = self.body.run(p, data, bs, opts)  # the child's step, same options
        y = self.out_keys[0]
        data[y] = data[y] + x
        return None if state is None else fd.TensorDict({"body": state}, [])


def _residual():
    return Residual(_bn_block())


ENTRIES["Residual(user-defined kind, BatchNorm)"] = Entry(Residual, _residual, _x33)

PUBLIC: tuple[type, ...] = (
    fd.Module,
    fd.Sequential,
    *fd.nn.LAYERS,
    fd.Probabilistic,
    fd.ProbabilisticSequential,
    fd.NormalParamExtractor,
)


def params_for(module, key=0, dtype=torch.float32):
    """Params of an entry's module: init for pure layers, the weights for the rest."""
    try:
        return module.init(key, dtype=dtype)
    except NotImplementedError:
        p = fd.from_module(module)
        return p.apply(lambda v: v.to(dtype) if v.is_floating_point() else v)


def call(module, params, td, key=None):
    """Call an entry's module the way its kind needs: with ``key`` when it is random,
    through ``apply_with_state`` (returning ``(td, new_state)``) when it is stateful."""
    key = key if module.random else None
    if module.stateful:  # every module kind answers (the calling protocol)
        return module.apply_with_state(params, td, key=key)
    return module(params, td, key=key) if key is not None else module(params, td)


def output(result):
    """The output td of ``call`` (drops a stateful module's new state)."""
    return result[0] if isinstance(result, tuple) else result


def members(module, n, dtype=torch.float32):
    """``n`` different params of an entry's module (an ensemble's members): ``init``
    with keys 0..n-1, or, for weights read from torch modules (all equal), shifted ones."""
    ps = [params_for(module, key=k, dtype=dtype) for k in range(n)]
    if all(torch.equal(a, b) for a, b in zip(fd.tree.leaves(ps[0]), fd.tree.leaves(ps[1]))):
        ps = [p.apply(lambda v, i=i: v + 0.1 * i) for i, p in enumerate(ps)]
    return ps

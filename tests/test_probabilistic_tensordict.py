"""Probabilistic modules against tensordict 0.15's on the same weights and inputs."""

import pytest
import torch
from torch import distributions as D
from torch import nn

import functd as fd

tensordict = pytest.importorskip("tensordict")
tdnn = pytest.importorskip("tensordict.nn")
from tensordict.nn.distributions import NormalParamExtractor as RefExtractor  # noqa: E402

MAPPINGS = [
    "biased_softplus_1.0",
    "biased_softplus",
    "biased_softplus_2.0",
    "biased_softplus_2.0_0.1",
    "biased_softplus_0.5_0.001",
    "softplus",
    "exp",
    "relu",
    "none",
    "expln",
]


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("shape", [(8,), (3, 8), (2, 3, 7)])
def test_normal_param_extractor_matches_tensordict(mapping, shape):
    x = torch.randn(shape) * 3
    ours = fd.NormalParamExtractor(scale_mapping=mapping, scale_lb=1e-3)(x)
    ref = RefExtractor(scale_mapping=mapping, scale_lb=1e-3)(x)
    assert len(ours) == len(ref) == 2
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_normal_param_extractor_defaults_and_passthrough():
    x, other = torch.randn(5, 6), torch.randn(5, 2)
    ours = fd.NormalParamExtractor()(x, other)
    ref = RefExtractor()(x, other)
    assert len(ours) == 3
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    assert fd.NormalParamExtractor() == fd.NormalParamExtractor("biased_softplus_1.0", 1e-4)
    assert hash(fd.NormalParamExtractor()) == hash(fd.NormalParamExtractor())


def _policies(dist=D.Normal, return_log_prob=True, out_key="action", **kw):
    net = nn.GRUCell(4, 8)
    ref = tdnn.ProbabilisticTensorDictSequential(
        tdnn.TensorDictModule(net, in_keys=["input", "hidden"], out_keys=["hidden"]),
        tdnn.TensorDictModule(RefExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        tdnn.ProbabilisticTensorDictModule(
            in_keys=["loc", "scale"],
            out_keys=[out_key],
            distribution_class=dist,
            return_log_prob=return_log_prob,
            **kw,
        ),
    )
    ours = fd.ProbabilisticSequential(
        fd.Module(net, in_keys=["input", "hidden"], out_keys=["hidden"]),
        fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        fd.Probabilistic(
            in_keys=["loc", "scale"],
            out_keys=[out_key],
            distribution_class=dist,
            return_log_prob=return_log_prob,
            **kw,
        ),
    )
    return ref, ours, fd.from_module(ours)


def _inputs(batch):
    return {"input": torch.randn(*batch, 4), "hidden": torch.randn(*batch, 8)}


def _pair(data, batch):
    ref_td = tensordict.TensorDict({k: v.clone() for k, v in data.items()}, list(batch))
    return ref_td, fd.TensorDict(data, list(batch))


def _assert_same(out, ref, keys):
    assert set(out.keys(True, True)) == set(ref.keys(True, True))
    for k in keys:
        assert torch.equal(out[k], ref[k]), k


@pytest.mark.parametrize("batch", [(3,), ()])
def test_gru_policy_deterministic_matches_tensordict(batch):
    ref, ours, params = _policies()
    ref_td, td = _pair(_inputs(batch), batch)
    out = ours(params, td)
    ref(ref_td)
    _assert_same(out, ref_td, ["action", "loc", "scale", "hidden", "action_log_prob"])
    assert torch.equal(out["action"], out["loc"])
    assert "action" not in td  # pure


def test_gru_policy_random_log_prob_matches_tensordict_dist():
    ref, ours, params = _policies()
    ref_td, td = _pair(_inputs((6,)), (6,))
    out = ours(params, td, key=fd.random.key(3), interaction=fd.InteractionType.RANDOM)
    assert not torch.equal(out["action"], out["loc"])
    ref_dist = ref.get_dist(ref_td.clone())
    # (tensordict's get_dist path may differ from its own forward by an ulp in softplus)
    torch.testing.assert_close(ref_dist.loc, out["loc"])
    torch.testing.assert_close(ref_dist.scale, out["scale"])
    torch.testing.assert_close(out["action_log_prob"], ref_dist.log_prob(out["action"]))
    # the sample is loc + eps * scale with eps = fd.random.normal(fold_in(key, 2), shape)
    eps = fd.random.normal(fd.random.fold_in(fd.random.key(3), 2), (6, 4))
    assert torch.equal(out["action"], out["loc"] + eps * out["scale"])


def test_get_dist_and_log_prob_match_tensordict():
    ref, ours, params = _policies()
    ref_td, td = _pair(_inputs((4,)), (4,))
    dist = ours.get_dist(params, td)
    ref_dist = ref.get_dist(ref_td.clone())
    assert type(dist) is type(ref_dist)
    torch.testing.assert_close(dist.loc, ref_dist.loc)
    torch.testing.assert_close(dist.scale, ref_dist.scale)
    sample = torch.randn(4, 4)
    ref_lp = ref.log_prob(ref_td.clone().set("action", sample))
    torch.testing.assert_close(ours.log_prob(params, td.set("action", sample)), ref_lp)


def test_independent_normal_matches_tensordict():
    def indep(loc, scale):
        return D.Independent(D.Normal(loc, scale), 1)

    ref, ours, params = _policies(dist=indep)
    ref_td, td = _pair(_inputs((3,)), (3,))
    out = ours(params, td)
    ref(ref_td)
    _assert_same(out, ref_td, ["action", "action_log_prob"])
    assert out["action_log_prob"].shape == (3,)


@pytest.mark.parametrize("it", ["mode", "mean", "deterministic"])
def test_interaction_types_match_tensordict(it):
    ref, ours, params = _policies()
    ref_td, td = _pair(_inputs((3,)), (3,))
    with fd.set_interaction_type(it):
        out = ours(params, td)
    with tdnn.set_interaction_type(it):
        ref(ref_td)
    _assert_same(out, ref_td, ["action", "action_log_prob"])


def test_nested_out_key_log_prob_naming_matches_tensordict():
    ref, ours, params = _policies(out_key=("agent", "action"))
    ref_td, td = _pair(_inputs((2,)), (2,))
    out = ours(params, td)
    ref(ref_td)
    _assert_same(out, ref_td, [("agent", "action"), ("agent", "action_log_prob")])


@pytest.mark.parametrize(
    "dist_cls, it",
    [
        (D.Categorical, "deterministic"),
        (D.Categorical, "mode"),
        (D.OneHotCategorical, "deterministic"),
        (D.Bernoulli, "deterministic"),
    ],
)
def test_discrete_heads_match_tensordict(dist_cls, it):
    lin = nn.Linear(3, 5)
    args = dict(
        in_keys=["logits"],
        out_keys=["a"],
        distribution_class=dist_cls,
        return_log_prob=True,
        default_interaction_type=it,
    )
    ref = tdnn.ProbabilisticTensorDictSequential(
        tdnn.TensorDictModule(lin, ["x"], ["logits"]), tdnn.ProbabilisticTensorDictModule(**args)
    )
    ours = fd.ProbabilisticSequential(fd.Module(lin, ["x"], ["logits"]), fd.Probabilistic(**args))
    x = torch.randn(7, 3)
    ref_td = ref(tensordict.TensorDict({"x": x}, [7]))
    out = ours(fd.from_module(ours), fd.TensorDict({"x": x}, [7]))
    _assert_same(out, ref_td, ["a", "a_log_prob", "logits"])


def test_two_heads_composite_matches_tensordict():
    lin = nn.Linear(3, 4)
    heads = [dict(in_keys=["loc", "scale"], out_keys=["a"], distribution_class=D.Normal)]
    ref_heads = [
        tdnn.ProbabilisticTensorDictModule(**heads[0], return_log_prob=True),
        tdnn.ProbabilisticTensorDictModule(
            in_keys={"loc": "a", "scale": "scale"},
            out_keys=["b"],
            distribution_class=D.Normal,
            return_log_prob=True,
        ),
    ]
    ours_heads = [
        fd.Probabilistic(**heads[0], return_log_prob=True),
        fd.Probabilistic(
            in_keys={"a": "loc", "scale": "scale"},
            out_keys=["b"],
            distribution_class=D.Normal,
            return_log_prob=True,
        ),
    ]
    ref = tdnn.ProbabilisticTensorDictSequential(
        tdnn.TensorDictModule(lin, ["x"], ["h"]),
        tdnn.TensorDictModule(RefExtractor(), ["h"], ["loc", "scale"]),
        *ref_heads,
    )
    ours = fd.ProbabilisticSequential(
        fd.Module(lin, ["x"], ["h"]),
        fd.Module(fd.NormalParamExtractor(), ["h"], ["loc", "scale"]),
        *ours_heads,
    )
    x = torch.randn(5, 3)
    params = fd.from_module(ours)
    ref_td = ref(tensordict.TensorDict({"x": x}, [5]))
    out = ours(params, fd.TensorDict({"x": x}, [5]))
    _assert_same(out, ref_td, ["a", "b", "a_log_prob", "b_log_prob"])
    lp = ours.log_prob(params, out)
    ref_lp = ref.log_prob(ref_td)
    assert set(lp.keys()) == set(ref_lp.keys()) == {"a_log_prob", "b_log_prob"}
    for k in ("a_log_prob", "b_log_prob"):
        assert torch.equal(lp[k], ref_lp[k])


def _kinds_of_slices(make_theirs, make_ours, rc):
    """The kind each slice of a (head, plain, head) sequence gets, in tensordict and here."""
    theirs, ours = make_theirs(rc), make_ours(rc)
    names = {
        tdnn.ProbabilisticTensorDictSequential: "probabilistic",
        tdnn.TensorDictSequential: "plain",
        fd.ProbabilisticSequential: "probabilistic",
        fd.Sequential: "plain",
    }
    out = []
    for s in (slice(0, 2), slice(1, 3), slice(0, 1), slice(1, 2), slice(0, 3)):
        a, b = theirs[s], ours[s]
        out.append((s, names[type(a)], names[type(b)]))
        if names[type(b)] == "probabilistic":
            assert b.return_composite == a.return_composite, s
    return out


@pytest.mark.parametrize("rc", [None, False, True])
def test_slices_of_a_probabilistic_sequential_follow_tensordicts_rule(rc):
    """tensordict's test_index_prob_seq: ``seq[:2]`` of (head, plain, head) with
    return_composite=False is a plain TensorDictSequential (a slice ending in a plain
    module); with return_composite (two heads: the default) it stays probabilistic."""

    def head(o):
        return dict(in_keys=["loc", "scale"], out_keys=[o], distribution_class=D.Normal)

    def theirs(rc):
        return tdnn.ProbabilisticTensorDictSequential(
            tdnn.ProbabilisticTensorDictModule(**head("a")),
            tdnn.TensorDictModule(lambda a: (a, a.exp()), ["a"], ["loc", "scale"]),
            tdnn.ProbabilisticTensorDictModule(**head("b")),
            return_composite=rc,
        )

    def ours(rc):
        return fd.ProbabilisticSequential(
            fd.Probabilistic(**head("a")),
            fd.Module(lambda a: (a, a.exp()), ["a"], ["loc", "scale"]),
            fd.Probabilistic(**head("b")),
            return_composite=rc,
        )

    rows = _kinds_of_slices(theirs, ours, rc)
    assert all(a == b for _, a, b in rows), rows
    if rc is False:
        assert type(ours(rc)[:2]) is fd.Sequential  # the regression of issue 26, item 9
    seq = ours(rc)
    sub = seq.select_subsequence(out_keys=["loc"])  # the same rule: (head, plain)
    assert len(sub) == 2
    assert type(sub) is type(seq[:2])

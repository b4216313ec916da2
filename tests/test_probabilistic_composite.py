"""Composite distributions, return_composite, num_samples, MEDIAN and the decorator form of
set_interaction_type, against tensordict 0.15 on the same weights and inputs."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import distributions as D
from torch import nn

import functd as fd
from functd.testing import assert_close

tensordict = pytest.importorskip("tensordict")
tdnn = pytest.importorskip("tensordict.nn")

RANDOM = fd.InteractionType.RANDOM
KEY = fd.random.key(0)
DMAP = {"cont": D.Normal, ("nested", "disc"): D.Categorical}
PARAM_KEYS = [
    ("params", "cont", "loc"),
    ("params", "cont", "scale"),
    ("params", "nested", "disc", "logits"),
]


def _split(h):
    return h[..., :4], nn.functional.softplus(h[..., 4:8]) + 0.1, h[..., 8:]


def _pair(return_log_prob=True, agg=False, **kw):
    """(tensordict's module, functd's, functd's params) of Linear -> params -> composite head."""
    lin = nn.Linear(3, 18)
    net = nn.Sequential(lin)
    head = dict(
        in_keys=["params"],
        distribution_class=None,
        distribution_kwargs={"distribution_map": DMAP, **kw.pop("dkw", {})},
        return_log_prob=return_log_prob,
        **kw,
    )
    ref = tdnn.ProbabilisticTensorDictSequential(
        tdnn.TensorDictModule(net, ["x"], ["h"]),
        tdnn.TensorDictModule(_split, ["h"], PARAM_KEYS),
        tdnn.ProbabilisticTensorDictModule(
            **{**head, "distribution_class": tdnn.CompositeDistribution}
        ),
    )
    ours = fd.ProbabilisticSequential(
        fd.Module(net, ["x"], ["h"]),
        fd.Module(_split, ["h"], PARAM_KEYS),
        fd.Probabilistic(
            **{**head, "distribution_class": fd.CompositeDistribution},
            composite_lp_aggregate=agg,
        ),
    )
    return ref, ours, fd.from_module(ours)


def _inputs(b=5):
    x = torch.randn(b, 3)
    return tensordict.TensorDict({"x": x.clone()}, [b]), fd.TensorDict({"x": x}, [b])


def _leaves(td):
    return {k: td[k] for k in td.keys(True, True)}


def _same(out, ref, exact=True):
    ours, theirs = _leaves(out), _leaves(ref)
    assert set(ours) == set(theirs)
    for k in ours:
        if exact:
            assert torch.equal(ours[k], theirs[k]), k
        else:
            torch.testing.assert_close(ours[k], theirs[k], msg=str(k))


# ------------------------------------------------------------------ composite heads
def test_composite_head_deterministic_outputs_and_key_layout_match_tensordict():
    ref, ours, params = _pair()
    ref_td, td = _inputs()
    out = ours(params, td)
    ref(ref_td)
    _same(out, ref_td)
    assert ("nested", "disc_log_prob") in out.keys(True, True)
    assert ours.out_keys[-4:] == (
        "cont",
        ("nested", "disc"),
        "cont_log_prob",
        ("nested", "disc_log_prob"),
    )
    assert set(td.keys()) == {"x"}  # pure


def test_composite_aggregated_layout_matches_tensordict():
    with tdnn.set_composite_lp_aggregate(True):
        ref, ours, params = _pair(agg=True)
        ref_td, td = _inputs()
        ref(ref_td)
        ref_lp = ref.log_prob(ref_td.clone())
    out = ours(params, td)
    _same(out, ref_td, exact=False)
    assert {"sample_log_prob", "cont_log_prob"} <= set(out.keys())
    lp = ours.log_prob(params, out)
    assert isinstance(lp, torch.Tensor)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(out["sample_log_prob"], ref_lp)
    assert ours.modules[-1].log_prob(None, out).shape == (5,)


def test_composite_random_draw_scored_by_tensordicts_distribution():
    ref, ours, params = _pair()
    ref_td, td = _inputs(4)
    out = ours(params, td, key=KEY, interaction=RANDOM)
    ref_dist = ref.get_dist(ref_td.clone())
    sample = tensordict.TensorDict(
        {"cont": out["cont"], "nested": {"disc": out["nested", "disc"]}}, [4]
    )
    ref_lp = ref_dist.log_prob(sample)
    torch.testing.assert_close(out["cont_log_prob"], ref_lp["cont_log_prob"])
    torch.testing.assert_close(out["nested", "disc_log_prob"], ref_lp["nested", "disc_log_prob"])
    # component i draws under fold_in(key of the head, i): the head is module 2
    k = fd.random.fold_in(KEY, 2)
    eps = fd.random.normal(fd.random.fold_in(k, 0), (4, 4))
    assert torch.equal(
        out["cont"], out["params", "cont", "loc"] + eps * out["params", "cont", "scale"]
    )


def test_composite_random_draw_statistics():
    head = fd.Probabilistic(
        ["params"], None, fd.CompositeDistribution, {"distribution_map": DMAP}, num_samples=4000
    )
    probs = torch.tensor([0.1, 0.2, 0.7])
    params = fd.TensorDict(
        {
            "cont": {"loc": torch.tensor([1.5]), "scale": torch.tensor([2.0])},
            "nested": {"disc": {"logits": probs.log()[None]}},
        },
        [1],
    )
    out = head(None, fd.TensorDict({"params": params}, [1]), key=KEY, interaction="random")
    cont, disc = out["cont"].double(), out["nested", "disc"]
    assert out.batch_size == (4000, 1)
    assert abs(cont.mean() - 1.5) < 4 * 2.0 / 4000**0.5
    assert abs(cont.std() / 2.0 - 1) < 0.05
    freq = torch.bincount(disc.flatten(), minlength=3).double() / 4000
    assert (freq - probs.double()).abs().max() < 4 * (0.25 / 4000) ** 0.5


def test_composite_get_dist_log_prob_entropy_match_tensordict():
    ref, ours, params = _pair()
    ref_td, td = _inputs()
    dist, ref_dist = ours.get_dist(params, td), ref.get_dist(ref_td.clone())
    assert isinstance(dist, fd.CompositeDistribution) and isinstance(dist, D.Distribution)
    assert list(dist) == list(ref_dist) == ["cont", ("nested", "disc")]
    torch.testing.assert_close(dist["cont"].loc, ref_dist["cont"].loc)
    torch.testing.assert_close(dist["nested", "disc"].logits, ref_dist["nested", "disc"].logits)
    x = torch.randn(5, 4)
    c = torch.randint(0, 10, (5,))
    sample = fd.TensorDict({"cont": x, "nested": {"disc": c}}, [5])
    ref_sample = tensordict.TensorDict({"cont": x, "nested": {"disc": c}}, [5])
    _same(dist.log_prob(sample), ref_dist.log_prob(ref_sample), exact=False)
    _same(
        dist.log_prob_composite(sample, include_sum=True),
        ref_dist.log_prob_composite(ref_sample, include_sum=True),
        exact=False,
    )
    _same(dist.entropy(), ref_dist.entropy(), exact=False)
    _same(
        dist.entropy_composite(include_sum=True),
        ref_dist.entropy_composite(include_sum=True),
        exact=False,
    )
    _same(dist.deterministic_sample, ref_dist.deterministic_sample)
    _same(dist.mode, ref_dist.mode)
    with tdnn.set_composite_lp_aggregate(True):
        torch.testing.assert_close(
            dist.log_prob(sample, aggregate=True), ref_dist.log_prob(ref_sample)
        )
        torch.testing.assert_close(dist.entropy(aggregate=True), ref_dist.entropy())
    # the head's log_prob and the sequence's: the per-key layout
    out = ours(params, td)
    ref(ref_td)
    _same(ours.log_prob(params, out), ref.log_prob(ref_td.clone()), exact=False)


def test_composite_name_map_and_custom_log_prob_keys_match_tensordict():
    kw = dict(
        dkw={"name_map": {"cont": ("agent", "move")}},
        log_prob_keys=[("agent", "lp_move"), "lp_disc"],
        out_keys=[("agent", "move"), ("nested", "disc")],
    )
    ref, ours, params = _pair(**kw)
    ref_td, td = _inputs()
    out = ours(params, td)
    ref(ref_td)
    _same(out, ref_td)
    assert ("agent", "lp_move") in out.keys(True, True)
    _same(ours.log_prob(params, out), ref.log_prob(ref_td.clone()), exact=False)


def test_composite_construction_and_bad_input():
    dist = fd.CompositeDistribution(
        fd.TensorDict({"a": {"loc": torch.zeros(2), "scale": torch.ones(2)}}, [2]),
        {"a": D.Normal},
        extra_kwargs={"a": {"validate_args": True}},
    )
    assert dist.batch_shape == (2,) and len(dist) == 1
    with pytest.raises(KeyError, match=r"lacks the sample 'a'"):
        dist.log_prob(fd.TensorDict({"b": torch.zeros(2)}, [2]))
    with pytest.raises(KeyError, match=r"params lack the entry 'b'"):
        fd.CompositeDistribution(fd.TensorDict({}, [2]), {"b": D.Normal})
    with pytest.raises(TypeError, match=r"params\['a'\] must be a TensorDict"):
        fd.CompositeDistribution(fd.TensorDict({"a": torch.zeros(2)}, [2]), {"a": D.Normal})
    with pytest.raises(KeyError, match=r"needs distribution_kwargs=.*distribution_map"):
        fd.Probabilistic(["params"], None, fd.CompositeDistribution)
    comp = dict(
        distribution_class=fd.CompositeDistribution, distribution_kwargs={"distribution_map": DMAP}
    )
    with pytest.raises(ValueError, match="are not the composite's sample keys"):
        fd.Probabilistic(["params"], ["cont"], **comp)
    with pytest.raises(ValueError, match="pass log_prob_keys"):
        fd.Probabilistic(["params"], None, **comp, return_log_prob=True, log_prob_key="lp")
    with pytest.raises(ValueError, match="log_prob_keys is for the per-key layout"):
        fd.Probabilistic(
            ["params"], None, **comp, log_prob_keys=["a", "b"], composite_lp_aggregate=True
        )
    with pytest.raises(ValueError, match="log_prob_keys has 1 keys for 2 sample keys"):
        fd.Probabilistic(["params"], None, **comp, log_prob_keys=["a"])
    with pytest.raises(ValueError, match=r"collides with 'cont'"):
        fd.Probabilistic(
            ["params"], None, **comp, return_log_prob=True, log_prob_keys=["cont", "b"]
        )
    with pytest.raises(TypeError, match="out_keys is required"):
        fd.Probabilistic(["loc"], None, D.Normal, {"scale": 1.0})
    with pytest.raises(NotImplementedError, match="needs a key"):
        fd.CompositeDistribution.from_distributions(
            [2],
            {"t": D.TransformedDistribution(D.Normal(torch.zeros(2), 1.0), [D.TanhTransform()])},
        ).entropy()


# ------------------------------------------------------------------ return_composite
def _two_heads(**kw):
    lin = nn.Linear(3, 8)
    mods = lambda P, M, ex: (  # noqa: E731
        M(lin, ["x"], ["h"]),
        M(ex(), ["h"], ["loc", "scale"]),
        P(
            in_keys=["loc", "scale"],
            out_keys=["a"],
            distribution_class=D.Normal,
            return_log_prob=True,
        ),
        P(
            in_keys=["loc", "scale"],
            out_keys=["b"],
            distribution_class=D.Normal,
            return_log_prob=True,
        ),
    )
    ref = tdnn.ProbabilisticTensorDictSequential(
        *mods(tdnn.ProbabilisticTensorDictModule, tdnn.TensorDictModule, tdnn.NormalParamExtractor),
        **kw,
    )
    ours = fd.ProbabilisticSequential(
        *mods(fd.Probabilistic, fd.Module, fd.NormalParamExtractor), **kw
    )
    return ref, ours, fd.from_module(ours)


def test_return_composite_false_gives_the_last_heads_distribution_as_tensordict():
    ref, ours, params = _two_heads(return_composite=False)
    assert ours.return_composite is False and ref.return_composite is False
    ref_td, td = _inputs()
    out = ours(params, td)
    ref(ref_td)
    _same(out, ref_td, exact=False)
    dist, ref_dist = ours.get_dist(params, td), ref.get_dist(ref_td.clone())
    assert type(dist) is type(ref_dist) is D.Normal
    torch.testing.assert_close(dist.loc, ref_dist.loc)
    lp = ours.log_prob(params, out)
    assert isinstance(lp, torch.Tensor)
    torch.testing.assert_close(lp, ref.log_prob(ref_td.clone()))


def test_return_composite_defaults_and_single_head_composite_match_tensordict():
    _, two, _ = _two_heads()
    assert two.return_composite is True
    lin = nn.Linear(3, 2)
    args = dict(
        in_keys=["loc"],
        out_keys=["a"],
        distribution_class=D.Normal,
        distribution_kwargs={"scale": 1.0},
        return_log_prob=True,
    )
    ref = tdnn.ProbabilisticTensorDictSequential(
        tdnn.TensorDictModule(lin, ["x"], ["loc"]),
        tdnn.ProbabilisticTensorDictModule(**args),
        tdnn.TensorDictModule(torch.tanh, ["a"], ["y"]),
    )
    ours = fd.ProbabilisticSequential(
        fd.Module(lin, ["x"], ["loc"]),
        fd.Probabilistic(**args),
        fd.Module(torch.tanh, ["a"], ["y"]),
    )
    assert ours.return_composite is True and ref.return_composite is True
    ref_td, td = _inputs()
    out, params = ours(fd.from_module(ours), td), fd.from_module(ours)
    ref(ref_td)
    dist = ours.get_dist(params, td)
    assert isinstance(dist, fd.CompositeDistribution) and list(dist) == ["a"]
    _same(ours.log_prob(params, out), ref.log_prob(ref_td.clone()), exact=False)
    assert type(ours[:2]) is fd.ProbabilisticSequential and ours[:2].return_composite is True
    assert ours.select_out_keys("a").return_composite is True
    with pytest.raises(TypeError, match=r"last module is not a fd\.Probabilistic"):
        fd.ProbabilisticSequential(*ours.modules, return_composite=False)
    with pytest.raises(TypeError):
        tdnn.ProbabilisticTensorDictSequential(*ref.module, return_composite=False)
    assert ours != fd.ProbabilisticSequential(*ours.modules[:2], return_composite=False)
    assert fd.ProbabilisticSequential(*ours.modules[:2]) != fd.ProbabilisticSequential(
        *ours.modules[:2], return_composite=True
    )


def test_composite_head_and_normal_head_merge_in_get_dist():
    lin = nn.Linear(3, 18)
    comp = fd.Probabilistic(
        ["params"], None, fd.CompositeDistribution, {"distribution_map": DMAP}, return_log_prob=True
    )
    tail = fd.Probabilistic({"cont": "loc"}, ["z"], D.Normal, {"scale": 1.0}, return_log_prob=True)
    seq = fd.ProbabilisticSequential(
        fd.Module(lin, ["x"], ["h"]), fd.Module(_split, ["h"], PARAM_KEYS), comp, tail
    )
    params = fd.from_module(seq)
    out = seq(params, _inputs()[1], key=KEY, interaction=RANDOM)
    dist = seq.get_dist(params, out)
    assert list(dist) == ["cont", ("nested", "disc"), "z"]
    assert torch.equal(dist["z"].loc, out["cont"])  # conditional on the sample in td
    lp = seq.log_prob(params, out)
    for k in ("cont_log_prob", ("nested", "disc_log_prob"), "z_log_prob"):
        torch.testing.assert_close(lp[k], out[k])
    total = seq.log_prob(params, out, aggregate=True)
    expect = (
        out["cont_log_prob"].sum(-1) + out["nested", "disc_log_prob"] + out["z_log_prob"].sum(-1)
    )
    torch.testing.assert_close(total, expect)


def test_nested_sample_key_already_in_td_is_kept_by_get_dist():
    seq = fd.ProbabilisticSequential(
        fd.Probabilistic(["loc"], [("agent", "a")], D.Normal, {"scale": 1.0}),
        fd.Probabilistic({("agent", "a"): "loc"}, ["b"], D.Normal, {"scale": 1.0}),
    )
    td = fd.TensorDict({"loc": torch.zeros(3), "agent": {"a": torch.ones(3)}}, [3])
    dist = seq.get_dist(None, td, key=KEY, interaction=RANDOM)
    assert torch.equal(dist["b"].loc, torch.ones(3))


# ------------------------------------------------------------------ num_samples
def _head(**kw):
    return fd.Probabilistic(["loc", "scale"], ["a"], D.Normal, return_log_prob=True, **kw)


def _normal_td(b=3, n=2):
    return fd.TensorDict({"loc": torch.randn(b, n), "scale": torch.rand(b, n) + 0.5}, [b])


@pytest.mark.parametrize("n", [5, (2, 3)])
def test_num_samples_is_vmap_over_split_keys(n):
    td, one, many = _normal_td(), _head(), _head(num_samples=n)
    shape = (n,) if isinstance(n, int) else n
    out = many(None, td, key=KEY, interaction=RANDOM)
    keys = fd.random.split(KEY, 6 if shape == (2, 3) else 5).reshape(*shape, 2)
    f = lambda k: one(None, td, key=k, interaction=RANDOM)  # noqa: E731
    for _ in shape:
        f = torch.func.vmap(f)
    assert_close(out, f(keys), rtol=0, atol=0)
    assert out.batch_size == (*shape, 3) and out["a"].shape == (*shape, 3, 2)
    torch.testing.assert_close(
        out["a_log_prob"], D.Normal(td["loc"], td["scale"]).log_prob(out["a"])
    )
    assert len(set(out["a"].reshape(-1, 3, 2)[:, 0, 0].tolist())) == out["a"].shape[0] * (
        1 if isinstance(n, int) else 3
    )
    # keyword form
    a, lp = many(None, loc=td["loc"], scale=td["scale"], key=KEY, interaction=RANDOM)
    assert torch.equal(a, out["a"]) and torch.equal(lp, out["a_log_prob"])


def test_num_samples_layout_matches_tensordict():
    td = _normal_td()
    ref_head = tdnn.ProbabilisticTensorDictModule(
        in_keys=["loc", "scale"],
        out_keys=["a"],
        distribution_class=D.Normal,
        return_log_prob=True,
        num_samples=4,
    )
    ref_td = tensordict.TensorDict({"loc": td["loc"], "scale": td["scale"]}, [3])
    ref_det = ref_head(ref_td.clone())
    _same(_head(num_samples=4)(None, td), ref_det)  # DETERMINISTIC: the value repeated
    with tdnn.set_interaction_type("random"):
        ref_rnd = ref_head(ref_td.clone())
    out = _head(num_samples=4)(None, td, key=KEY, interaction=RANDOM)
    assert out.batch_size == ref_rnd.batch_size == (4, 3)
    assert {k: v.shape for k, v in _leaves(out).items()} == {
        k: v.shape for k, v in _leaves(ref_rnd).items()
    }
    torch.testing.assert_close(out["a_log_prob"], ref_head.get_dist(ref_td).log_prob(out["a"]))


def test_num_samples_in_a_sequence_and_bad_uses():
    lin = nn.Linear(3, 4)
    pol = lambda **kw: fd.ProbabilisticSequential(  # noqa: E731
        fd.Module(lin, ["x"], ["h"]),
        fd.Module(fd.NormalParamExtractor(), ["h"], ["loc", "scale"]),
        _head(**kw),
    )
    params = fd.from_module(pol())
    td = _inputs(3)[1]
    out = pol(num_samples=6)(params, td, key=KEY, interaction=RANDOM)
    single = pol()
    ref = torch.func.vmap(lambda k: single(params, td, key=k, interaction=RANDOM))(
        fd.random.split(KEY, 6)
    )
    assert_close(out, ref, rtol=0, atol=0)
    assert out.batch_size == (6, 3) and torch.equal(out["x"], td["x"].expand(6, 3, 3))
    lp = pol(num_samples=6).log_prob(params, out)
    torch.testing.assert_close(lp, out["a_log_prob"])
    with pytest.raises(ValueError, match=r"a plain fd\.Sequential cannot do"):
        fd.Sequential(fd.Module(torch.tanh, ["loc"], ["loc"]), _head(num_samples=2))(
            None, _normal_td()
        )
    with pytest.raises(ValueError, match="2 heads set num_samples"):
        fd.ProbabilisticSequential(_head(num_samples=2), _head(num_samples=2))
    for bad in (0, -1, (), "3", (2, 0)):
        with pytest.raises(ValueError, match="num_samples must be a positive int"):
            _head(num_samples=bad)
    with pytest.raises(ValueError, match="must be one key of shape"):
        _head(num_samples=2)(None, _normal_td(), key=fd.random.split(KEY, 2))


# ------------------------------------------------------------------ interaction types
class MedianNormal(D.Normal):
    @property
    def median(self):
        return self.loc * 1.0


def test_median_and_from_str_match_tensordict():
    assert fd.InteractionType.from_str("Median") is fd.InteractionType.MEDIAN
    assert fd.InteractionType.from_str("RANDOM") is RANDOM
    assert fd.InteractionType(tdnn.InteractionType.MEDIAN) is fd.InteractionType.MEDIAN
    assert {m.value for m in fd.InteractionType} == {m.value for m in tdnn.InteractionType}
    with pytest.raises(ValueError, match="unknown interaction type 'middle'"):
        fd.InteractionType.from_str("middle")
    args = dict(
        in_keys=["loc", "scale"],
        out_keys=["a"],
        distribution_class=MedianNormal,
        return_log_prob=True,
        default_interaction_type="median",
    )
    td = _normal_td()
    ref_td = tensordict.TensorDict(_leaves(td), [3])
    _same(fd.Probabilistic(**args)(None, td), tdnn.ProbabilisticTensorDictModule(**args)(ref_td))
    args["distribution_class"] = D.Normal
    with pytest.raises(NotImplementedError, match="Normal has no median"):
        fd.Probabilistic(**args)(None, td)
    with pytest.raises(NotImplementedError):
        tdnn.ProbabilisticTensorDictModule(**args)(ref_td)


class ShiftedMedianNormal(D.Normal):
    """A median that differs from the mean, so the interaction type shows in the value."""

    @property
    def median(self):
        return self.loc + self.scale


def test_set_interaction_type_as_decorator_matches_tensordict():
    args = dict(in_keys=["loc", "scale"], out_keys=["a"], distribution_class=ShiftedMedianNormal)
    head, ref_head = fd.Probabilistic(**args), tdnn.ProbabilisticTensorDictModule(**args)

    @fd.set_interaction_type("median")
    def act(td):
        """Doc."""
        return head(None, td)

    @tdnn.set_interaction_type("median")
    def ref_act(td):
        return ref_head(td)

    td = _normal_td()
    ref_td = tensordict.TensorDict(_leaves(td), [3])
    out = act(td)
    _same(out, ref_act(ref_td))
    assert torch.equal(out["a"], td["loc"] + td["scale"])
    assert act.__name__ == "act" and act.__doc__ == "Doc."
    assert head(None, td)["a"] is td["loc"]  # restored after the call
    with fd.set_interaction_type("mode"):
        assert torch.equal(act(td)["a"], out["a"])  # the decorator's type inside its call
        assert torch.equal(head(None, td)["a"], td["loc"])  # and the block's after it
    with pytest.raises(TypeError, match="decorates a function"):
        fd.set_interaction_type("random")(3)


# ------------------------------------------------------------------ one missing sentinel
@pytest.mark.parametrize("fast", [True, False])
def test_missing_nested_parameter_raises_functds_key_error(fast):
    cls = D.Normal if fast else (lambda loc, scale: D.Normal(loc, scale))
    head = fd.Probabilistic([("p", "loc"), ("p", "scale")], ["a"], cls)
    assert (head._normal is not None) is fast
    td = fd.TensorDict({"p": {"loc": torch.zeros(2)}}, [2])
    with pytest.raises(KeyError, match=r"reads \('p', 'scale'\), which the tensordict lacks"):
        head(None, td)
    with pytest.raises(KeyError, match=r"reads \('p', 'scale'\)"):
        head(None, td, key=KEY, interaction=RANDOM)
    with pytest.raises(KeyError, match=r"reads \('p', 'loc'\)"):
        head(None, fd.TensorDict({"p": torch.zeros(2)}, [2]))
    with pytest.raises(KeyError, match=r"reads \('p', 'scale'\)"):
        head.get_dist(None, td)


@pytest.mark.compile
def test_num_samples_compiles_to_the_eager_numbers():
    torch._dynamo.reset()
    head, td = _head(num_samples=4), _normal_td()
    f = torch.compile(
        lambda t, k: head(None, t, key=k, interaction=RANDOM), fullgraph=True, backend="aot_eager"
    )
    assert_close(f(td, KEY), head(None, td, key=KEY, interaction=RANDOM), rtol=0, atol=0)


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 5))
def test_law_num_samples_row_i_is_the_one_sample_call_under_split_key_i(seed, n):
    td, one, many = _normal_td(), _head(), _head(num_samples=n)
    key = fd.random.key(seed)
    out = many(None, td, key=key, interaction=RANDOM)
    for i, k in enumerate(fd.random.split(key, n)):
        row = one(None, td, key=k, interaction=RANDOM)
        torch.testing.assert_close(out["a"][i], row["a"], rtol=0, atol=0)
        torch.testing.assert_close(out["a_log_prob"][i], row["a_log_prob"], rtol=1e-6, atol=1e-6)


@given(seed=st.integers(0, 2**31 - 1))
def test_law_aggregated_log_prob_is_the_sum_of_the_per_key_entries(seed):
    g = torch.Generator().manual_seed(seed)
    params = fd.TensorDict(
        {
            "cont": {
                "loc": torch.randn(3, 4, generator=g),
                "scale": torch.rand(3, 4, generator=g) + 0.1,
            },
            "nested": {"disc": {"logits": torch.randn(3, 10, generator=g)}},
        },
        [3],
    )
    dist = fd.CompositeDistribution(params, DMAP)
    x = dist.sample(fd.random.key(seed))
    per_key = dist.log_prob(x)
    total = dist.log_prob(x, aggregate=True)
    torch.testing.assert_close(
        total, per_key["cont_log_prob"].sum(-1) + per_key["nested", "disc_log_prob"]
    )
    torch.testing.assert_close(
        dist.log_prob_composite(x, include_sum=True)["sample_log_prob"], total
    )


def test_aggregated_plain_heads_match_tensordict():
    """tensordict's set_composite_lp_aggregate(True): every head writes "sample_log_prob"
    (the last head's survives) and the sequence's log_prob is the sum over heads."""
    lin = nn.Linear(3, 8)

    def mods(P, M, b_in, **kw):
        return (
            M(lin, ["x"], ["h"]),
            M(fd.NormalParamExtractor(), ["h"], ["loc", "scale"]),
            P(["loc", "scale"], ["a"], distribution_class=D.Normal, return_log_prob=True, **kw),
            P(b_in, ["b"], distribution_class=D.Normal, return_log_prob=True, **kw),
        )

    ref_td, td = _inputs()
    with tdnn.set_composite_lp_aggregate(True):
        ref = tdnn.ProbabilisticTensorDictSequential(
            *mods(
                tdnn.ProbabilisticTensorDictModule,
                tdnn.TensorDictModule,
                {"loc": "a", "scale": "scale"},
            )
        )
        ref(ref_td)
        ref_lp = ref.log_prob(ref_td.clone())
    ours = fd.ProbabilisticSequential(
        *mods(
            fd.Probabilistic, fd.Module, {"a": "loc", "scale": "scale"}, composite_lp_aggregate=True
        )
    )
    params = fd.from_module(ours)
    out = ours(params, td)
    _same(out, ref_td, exact=False)
    assert "sample_log_prob" in out and "a_log_prob" not in out
    torch.testing.assert_close(ours.log_prob(params, out), ref_lp)

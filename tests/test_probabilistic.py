"""Probabilistic modules: laws (keys, vmap, compile, purity), samplers' statistics, bad input."""

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import distributions as D
from torch import nn

import functd as fd
from functd._modules._distributions import SUPPORTED, draw
from functd.testing import assert_close

RANDOM = fd.InteractionType.RANDOM
KEY = fd.random.key(0)


def _policy():
    return fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(4, 8), in_keys=["input", "hidden"], out_keys=["hidden"]),
        fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        fd.Probabilistic(
            in_keys=["loc", "scale"],
            out_keys=["action"],
            distribution_class=D.Normal,
            return_log_prob=True,
        ),
    )


def _td(b=3):
    return fd.TensorDict({"input": torch.randn(b, 4), "hidden": torch.randn(b, 8)}, [b])


def _head(**kw):
    kw.setdefault("in_keys", ["loc", "scale"])
    kw.setdefault("out_keys", ["action"])
    kw.setdefault("distribution_class", D.Normal)
    return fd.Probabilistic(**kw)


def _normal_td(b=5, n=3):
    return fd.TensorDict({"loc": torch.randn(b, n), "scale": torch.rand(b, n) + 0.5}, [b])


def _snapshot(*trees):
    return [(id(v), v.clone()) for v in fd.tree.leaves(trees)]


def _unchanged(before, *trees):
    after = fd.tree.leaves(trees)
    assert [i for i, _ in before] == [id(v) for v in after]
    assert all(torch.equal(v, w) for (_, v), w in zip(before, after))


# ------------------------------------------------------------------ laws
@given(seed=st.integers(0, 2**31 - 1))
def test_same_key_same_output_different_keys_differ(seed):
    pol, td = _policy(), _td()
    params = pol.init(fd.random.key(1))
    k1, k2 = fd.random.split(fd.random.key(seed))
    a = pol(params, td, key=k1, interaction=RANDOM)
    b = pol(params, td, key=k1, interaction=RANDOM)
    c = pol(params, td, key=k2, interaction=RANDOM)
    assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a["action"], c["action"])
    assert torch.equal(a["loc"], c["loc"])


def test_deterministic_default_needs_no_key_and_ignores_it():
    pol, td = _policy(), _td()
    params = pol.init(KEY)
    a = pol(params, td)
    assert torch.equal(a["action"], a["loc"])
    assert_close(pol(params, td, key=KEY), a, rtol=0, atol=0)
    lp = D.Normal(a["loc"], a["scale"]).log_prob(a["loc"])
    assert torch.equal(a["action_log_prob"], lp)


def test_vmap_over_keys_equals_loop_and_gives_different_actions():
    pol, td = _policy(), _td()
    params = pol.init(KEY)
    keys = fd.random.split(KEY, 8)
    batched = torch.func.vmap(lambda k: pol(params, td, key=k, interaction=RANDOM))(keys)
    looped = fd.stack([pol(params, td, key=k, interaction=RANDOM) for k in keys])
    assert batched.batch_size == (8, 3)
    assert_close(batched, looped, rtol=1e-6, atol=1e-6)
    first = batched["action"][:, 0, 0]
    assert len(set(first.tolist())) == 8


def test_purity_inputs_unchanged():
    pol, td = _policy(), _td()
    params = pol.init(KEY)
    before = _snapshot(params, td, KEY)
    pol(params, td, key=KEY, interaction=RANDOM)
    pol.get_dist(params, td)
    pol.log_prob(params, pol(params, td))
    _unchanged(before, params, td, KEY)
    assert set(td.keys()) == {"input", "hidden"}


def test_head_key_is_folded_by_position_and_stable_when_appending():
    pol, td = _policy(), _td()
    params = pol.init(KEY)
    a = pol(params, td, key=KEY, interaction=RANDOM)
    longer = fd.ProbabilisticSequential(
        *pol.modules, fd.Module(torch.tanh, in_keys=["action"], out_keys=["squashed"])
    )
    b = longer(params, td, key=KEY, interaction=RANDOM)
    assert torch.equal(a["action"], b["action"])
    eps = fd.random.normal(fd.random.fold_in(KEY, 2), (3, 4))
    assert torch.equal(a["action"], a["loc"] + eps * a["scale"])


def test_interaction_argument_context_and_default_precedence():
    head, td = _head(), _normal_td()
    rnd = _head(default_interaction_type="random")
    assert torch.equal(head(None, td)["action"], td["loc"])
    x = rnd(None, td, key=KEY)["action"]
    assert not torch.equal(x, td["loc"])
    with fd.set_interaction_type(RANDOM):
        assert torch.equal(head(None, td, key=KEY)["action"], x)
        # the explicit argument wins over the context
        assert torch.equal(head(None, td, interaction="mode")["action"], td["loc"])
        with fd.set_interaction_type(None):  # None: each module's default
            assert torch.equal(head(None, td)["action"], td["loc"])
    assert fd.InteractionType("RANDOM") is RANDOM
    assert head(None, td)["action"] is td["loc"]  # restored after the block


def test_plain_sequential_with_a_head_uses_the_context():
    seq = fd.Module(lambda x: x * 2, ["x"], ["loc"]) >> _head(
        in_keys=["loc"], distribution_kwargs={"scale": 1.0}
    )
    assert type(seq) is fd.Sequential
    td = fd.TensorDict({"x": torch.randn(4, 2)}, [4])
    assert torch.equal(seq(None, td)["action"], td["x"] * 2)
    with fd.set_interaction_type("random"):
        out = seq(None, td, key=KEY)
    eps = fd.random.normal(fd.random.fold_in(KEY, 1), (4, 2))
    assert torch.equal(out["action"], td["x"] * 2 + eps * 1.0)


def test_grad_of_log_prob_matches_autograd():
    pol, td = _policy(), _td()
    params = pol.init(KEY)

    def loss(p):
        return pol(p, td, key=KEY, interaction=RANDOM)["action_log_prob"].sum()

    g = torch.func.grad(loss)(params)
    leaves = [v.detach().requires_grad_() for v in fd.tree.leaves(params)]
    p2 = fd.tree.unflatten(fd.tree.structure(params), leaves)
    loss(p2).backward()
    for a, b in zip(fd.tree.leaves(g), leaves):
        torch.testing.assert_close(a, b.grad)
    assert any(v.abs().sum() > 0 for v in fd.tree.leaves(g))


def test_structure_value_semantics_and_flattening():
    pol = _policy()
    assert pol == _policy() and hash(pol) == hash(_policy())
    assert pol.modules[2] == _head(return_log_prob=True)
    assert pol.modules[2] != _head()
    assert pol.out_keys == ("hidden", "loc", "scale", "action", "action_log_prob")
    assert pol.in_keys == ("input", "hidden")
    nested = fd.ProbabilisticSequential(fd.Sequential(*pol.modules[:2]), pol.modules[2])
    assert nested == pol
    outer = fd.Sequential(pol, fd.Module(torch.tanh, ["action"], ["a2"]))
    assert len(outer) == 4 and type(outer) is fd.Sequential
    assert type(pol[1:]) is fd.ProbabilisticSequential and type(pol[:2]) is fd.Sequential
    small = pol.select_out_keys("action")
    assert type(small) is fd.ProbabilisticSequential
    out = small(pol.init(KEY), _td())
    assert set(out.keys()) == {"input", "hidden", "action"}
    assert pol.init(KEY).keys() == ("0",)
    assert fd.from_module(pol).keys() == ("0",)
    with pytest.raises(TypeError, match="immutable"):
        pol.modules[2].return_log_prob = False


def test_keyword_call_and_get_dist_and_log_prob():
    head = _head(return_log_prob=True)
    loc, scale = torch.randn(3), torch.rand(3) + 0.1
    action, lp = head(None, loc=loc, scale=scale, key=KEY, interaction=RANDOM)
    eps = fd.random.normal(KEY, (3,))
    assert torch.equal(action, loc + eps * scale)
    assert torch.equal(lp, D.Normal(loc, scale).log_prob(action))
    td = fd.TensorDict({"loc": loc, "scale": scale, "action": action}, [])
    assert torch.equal(head.log_prob(None, td), lp)
    assert isinstance(head.get_dist(None, td), D.Normal)


def test_dict_in_keys_nested_keys_and_custom_log_prob_key():
    head = fd.Probabilistic(
        {("p", "mu"): "loc", "sigma": "scale"},
        [("out", "a")],
        D.Normal,
        return_log_prob=True,
        log_prob_key="lp",
    )
    td = fd.TensorDict({"p": {"mu": torch.zeros(2, 3)}, "sigma": torch.ones(2, 3)}, [2])
    out = head(None, td)
    assert torch.equal(out["out", "a"], torch.zeros(2, 3))
    assert torch.equal(out["lp"], D.Normal(0.0, 1.0).log_prob(torch.zeros(2, 3)))
    assert head.out_keys == (("out", "a"), "lp")
    default = fd.Probabilistic(["loc"], [("agent", "act")], D.Normal, {"scale": 1.0}, True)
    assert default.log_prob_key == ("agent", "act_log_prob")


def test_composite_heads_get_dist_and_conditional_log_prob():
    seq = fd.ProbabilisticSequential(
        _head(out_keys=["a"], return_log_prob=True),
        fd.Probabilistic({"a": "loc", "scale": "scale"}, ["b"], D.Normal, return_log_prob=True),
    )
    td = _normal_td()
    out = seq(None, td, key=KEY, interaction=RANDOM)
    dist = seq.get_dist(None, out)
    assert isinstance(dist, fd.CompositeDistribution) and set(dist.dists) == {"a", "b"}
    assert torch.equal(dist.dists["b"].loc, out["a"])  # conditional on the sample in td
    lp = seq.log_prob(None, out)
    assert torch.equal(lp["a_log_prob"], out["a_log_prob"])
    assert torch.equal(lp["b_log_prob"], out["b_log_prob"])
    assert torch.equal(dist.deterministic_sample["a"], td["loc"])
    s = dist.sample(KEY)
    assert s.batch_size == (5,) and set(s.keys()) == {"a", "b"}
    # without the samples in td, get_dist draws the earlier head with the interaction
    dist2 = seq.get_dist(None, td)
    assert torch.equal(dist2.dists["b"].loc, td["loc"])


def test_transformed_tanh_normal_deterministic_is_tanh_of_loc():
    def tanh_normal(loc, scale):
        return D.TransformedDistribution(D.Normal(loc, scale), [D.TanhTransform()])

    head = _head(distribution_class=tanh_normal, return_log_prob=True)
    td = _normal_td()
    out = head(None, td)
    assert torch.equal(out["action"], torch.tanh(td["loc"]))
    r = head(None, td, key=KEY, interaction=RANDOM)["action"]
    eps = fd.random.normal(KEY, (5, 3))
    torch.testing.assert_close(r, torch.tanh(td["loc"] + eps * td["scale"]))
    assert r.abs().max() < 1


def test_mean_without_mean_averages_keyed_draws():
    def tanh_normal(loc, scale):
        return D.TransformedDistribution(D.Normal(loc, scale), [D.TanhTransform()])

    head = _head(distribution_class=tanh_normal, n_empirical_estimate=4000)
    td = fd.TensorDict({"loc": torch.zeros(2), "scale": torch.full((2,), 0.1)}, [2])
    out = head(None, td, key=KEY, interaction="mean")["action"]
    assert out.abs().max() < 0.01 and torch.equal(
        out, head(None, td, key=KEY, interaction="mean")["action"]
    )


@pytest.mark.compile
def test_compile_equals_eager_random_policy():
    torch._dynamo.reset()
    pol, td = _policy(), _td()
    params = pol.init(KEY)

    def f(p, t, k):
        return pol(p, t, key=k, interaction=RANDOM)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert_close(compiled(params, td, KEY), f(params, td, KEY), rtol=1e-6, atol=1e-6)
    k2 = fd.random.key(5)
    assert_close(compiled(params, td, k2), f(params, td, k2), rtol=1e-6, atol=1e-6)


@pytest.mark.compile
def test_compile_reads_the_context_when_the_call_starts():
    torch._dynamo.reset()
    head, td = _head(), _normal_td()
    compiled = torch.compile(lambda t, k: head(None, t, key=k), fullgraph=True, backend="eager")
    det = compiled(td, KEY)
    with fd.set_interaction_type(RANDOM):
        rnd = compiled(td, KEY)
    assert torch.equal(det["action"], td["loc"])
    assert torch.equal(rnd["action"], head(None, td, key=KEY, interaction=RANDOM)["action"])
    assert torch.equal(compiled(td, KEY)["action"], td["loc"])


def test_compile_reads_the_context_in_a_fresh_process():
    """The guard on the context, with no other compiled code before (dynamo installs no
    guard on a threading.local: the suite's earlier compiles once hid a stale read)."""
    code = (
        "import torch, functd as fd\n"
        "head = fd.Probabilistic(in_keys=['loc', 'scale'], out_keys=['action'],"
        " distribution_class=torch.distributions.Normal)\n"
        "td = fd.TensorDict({'loc': torch.zeros(3), 'scale': torch.ones(3)}, [3])\n"
        "k = fd.random.key(0)\n"
        "c = torch.compile(lambda t, k: head(None, t, key=k), fullgraph=True, backend='eager')\n"
        "first = c(td, k)['action']\n"
        "with fd.set_interaction_type('random'):\n"
        "    rnd = c(td, k)['action']\n"
        "with fd.set_interaction_type('random'):\n"
        "    ref = head(None, td, key=k)['action']\n"
        "assert torch.equal(first, td['loc']), first\n"
        "assert torch.equal(rnd, ref), (rnd, ref)\n"
        "assert torch.equal(c(td, k)['action'], td['loc'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


# ------------------------------------------------------------------ samplers
N = 40000


def _ks(x: torch.Tensor, cdf) -> float:
    x, _ = torch.sort(x.double().flatten())
    n = x.numel()
    f = cdf(x)
    hi = torch.arange(1, n + 1, dtype=torch.float64) / n
    lo = torch.arange(0, n, dtype=torch.float64) / n
    return max((hi - f).abs().max().item(), (f - lo).abs().max().item())


KS_BOUND = 1.95 / math.sqrt(N)  # 99.9%: deterministic keys, so no flakiness anyway

CONTINUOUS = {
    "Normal": (D.Normal(torch.tensor(1.5), torch.tensor(2.0)), True),
    "Uniform": (D.Uniform(torch.tensor(-1.0), torch.tensor(3.0)), True),
    "Exponential": (D.Exponential(torch.tensor(2.5)), True),
    "Laplace": (D.Laplace(torch.tensor(0.5), torch.tensor(1.5)), True),
    "Cauchy": (D.Cauchy(torch.tensor(0.0), torch.tensor(1.0)), True),
    "Gamma(3)": (D.Gamma(torch.tensor(3.0), torch.tensor(2.0)), True),
    "Gamma(0.4)": (D.Gamma(torch.tensor(0.4), torch.tensor(1.0)), True),
    "Chi2": (D.Chi2(torch.tensor(4.0)), True),
    "LogNormal": (D.LogNormal(torch.tensor(0.0), torch.tensor(0.5)), True),
    "HalfNormal": (D.HalfNormal(torch.tensor(1.0)), True),
    "Gumbel": (D.Gumbel(torch.tensor(1.0), torch.tensor(2.0)), True),
    "Beta": (D.Beta(torch.tensor(2.0), torch.tensor(5.0)), False),
    "Kumaraswamy": (D.Kumaraswamy(torch.tensor(2.0), torch.tensor(3.0)), False),
}


@pytest.mark.parametrize("name", sorted(CONTINUOUS))
def test_continuous_sampler_statistics(name):
    dist, has_cdf = CONTINUOUS[name]
    x = draw(dist, fd.random.key(11), (N,)).double()
    assert x.shape == (N,)
    if has_cdf:
        cdf = _cdf(dist)
        assert _ks(x, cdf) < KS_BOUND
    if name != "Cauchy":
        mean, var = dist.mean.double(), dist.variance.double()
        assert abs(x.mean() - mean) < 4.5 * math.sqrt(var / N)
        assert abs(x.var() / var - 1) < 0.06


def _cdf(dist):
    if isinstance(dist, D.Gamma):  # incl. Chi2
        a, r = dist.concentration.double(), dist.rate.double()
        return lambda x: torch.special.gammainc(a, r * x)
    if isinstance(dist, D.HalfNormal):
        return lambda x: torch.special.erf(x / (dist.scale.double() * math.sqrt(2)))
    if isinstance(dist, D.Gumbel):
        loc, scale = dist.loc.double(), dist.scale.double()
        return lambda x: torch.exp(-torch.exp(-(x - loc) / scale))
    return lambda x: dist.cdf(
        x.to(dist.mean.dtype if not isinstance(dist, D.Cauchy) else x.dtype)
    ).double()


def test_discrete_sampler_frequencies():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    c = draw(D.Categorical(probs=probs), fd.random.key(2), (N,))
    freq = torch.bincount(c, minlength=4).double() / N
    assert (freq - probs.double()).abs().max() < 4 * math.sqrt(0.25 / N)
    oh = draw(D.OneHotCategorical(probs=probs), fd.random.key(3), (N,))
    assert oh.shape == (N, 4) and torch.equal(oh.sum(-1), torch.ones(N))
    assert (oh.double().mean(0) - probs.double()).abs().max() < 4 * math.sqrt(0.25 / N)
    b = draw(D.Bernoulli(probs=torch.tensor(0.3)), fd.random.key(4), (N,))
    assert b.dtype == torch.float32 and abs(b.double().mean() - 0.3) < 4 * math.sqrt(0.21 / N)


def test_multivariate_normal_and_dirichlet_moments():
    cov = torch.tensor([[2.0, 0.6], [0.6, 1.0]])
    x = draw(D.MultivariateNormal(torch.tensor([1.0, -1.0]), cov), fd.random.key(5), (N,))
    torch.testing.assert_close(torch.cov(x.T), cov, atol=0.06, rtol=0)
    alpha = torch.tensor([1.0, 2.0, 3.0])
    d = draw(D.Dirichlet(alpha), fd.random.key(6), (N,))
    torch.testing.assert_close(d.mean(0), alpha / alpha.sum(), atol=0.01, rtol=0)
    torch.testing.assert_close(d.sum(-1), torch.ones(N))


def test_reparameterised_gradients():
    loc, scale = torch.tensor(0.3, requires_grad=True), torch.tensor(1.2, requires_grad=True)
    x = draw(D.Normal(loc, scale), KEY, (N,))
    gl, gs = torch.autograd.grad(x.mean(), (loc, scale))
    torch.testing.assert_close(gl, torch.tensor(1.0))
    torch.testing.assert_close(gs, (x.detach().mean() - loc.detach()) / scale.detach())
    alpha = torch.tensor(2.5, requires_grad=True)
    g = draw(D.Gamma(alpha, torch.tensor(1.0)), KEY, (N,))
    (ga,) = torch.autograd.grad(g.mean(), alpha)  # d E[x] / d alpha = 1
    assert abs(ga.item() - 1.0) < 0.03


def test_sampler_list_names_the_supported():
    assert "Normal" in SUPPORTED and "Categorical" in SUPPORTED


# ------------------------------------------------------------------ bad input
def test_missing_distribution_parameter():
    head, td = _head(), fd.TensorDict({"loc": torch.zeros(2)}, [2])
    before = _snapshot(td)
    with pytest.raises(
        KeyError, match=r"Probabilistic\(Normal -> 'action'\) reads 'scale'.*has: 'loc'"
    ):
        head(None, td)
    _unchanged(before, td)
    pol = _policy()
    with pytest.raises(KeyError, match="reads 'hidden'"):
        pol(pol.init(KEY), fd.TensorDict({"input": torch.zeros(2, 4)}, [2]))


def test_random_without_a_key():
    pol, td = _policy(), _td()
    params = pol.init(KEY)
    before = _snapshot(params, td)
    with pytest.raises(
        ValueError, match=r"RANDOM draws a sample and needs a PRNG key.*key=fd\.random\.key"
    ):
        pol(params, td, interaction=RANDOM)
    with fd.set_interaction_type(RANDOM), pytest.raises(ValueError, match="needs a PRNG key"):
        pol(params, td)
    _unchanged(before, params, td)


def test_bad_keys():
    head, td = _head(), _normal_td()
    with pytest.raises(ValueError, match=r"one key of shape \(2,\), got shape \(4, 2\).*vmap"):
        head(None, td, key=fd.random.split(KEY, 4), interaction=RANDOM)
    with pytest.raises(
        TypeError, match=r"`key` must be a functd.random key.*got dtype torch.float32"
    ):
        head(None, td, key=torch.zeros(2), interaction=RANDOM)
    with pytest.raises(TypeError, match="got int"):
        head(None, td, key=0, interaction=RANDOM)


def test_unsupported_distribution_under_random():
    head = fd.Probabilistic(["rate"], ["n"], D.Poisson)
    td = fd.TensorDict({"rate": torch.ones(3)}, [3])
    before = _snapshot(td)
    assert torch.equal(head(None, td)["n"], torch.ones(3))  # DETERMINISTIC: the mean
    with pytest.raises(
        TypeError,
        match=r"Probabilistic\(Poisson -> 'n'\) under InteractionType.RANDOM: cannot draw from Poisson.*supported: Normal, Uniform",
    ):
        head(None, td, key=KEY, interaction=RANDOM)
    _unchanged(before, td)


def test_log_prob_key_collisions():
    with pytest.raises(ValueError, match=r"log_prob_key 'action' collides with 'action'"):
        _head(return_log_prob=True, log_prob_key="action")
    with pytest.raises(ValueError, match=r"log_prob_key 'loc' collides with 'loc'"):
        _head(return_log_prob=True, log_prob_key="loc")
    with pytest.raises(ValueError, match=r"collides with \('a', 'b'\)"):
        _head(out_keys=[("a", "b")], return_log_prob=True, log_prob_key="a")


def test_bad_construction():
    with pytest.raises(ValueError, match="writes one sample, but out_keys has 2"):
        _head(out_keys=["a", "b"])
    with pytest.raises(
        TypeError, match=r"takes no argument\(s\) \['mu'\].*dict in_keys maps td keys"
    ):
        _head(in_keys=["mu", "scale"])
    with pytest.raises(ValueError, match="unknown interaction type 'sometimes'"):
        _head(default_interaction_type="sometimes")
    with pytest.raises(ValueError, match="unknown interaction type"):
        fd.set_interaction_type("often")
    with pytest.raises(TypeError, match=r"needs at least one fd\.Probabilistic"):
        fd.ProbabilisticSequential(fd.Module(torch.tanh, ["x"], ["y"]))
    with pytest.raises(ValueError, match="unknown scale_mapping 'sofplus'; use one of softplus"):
        fd.NormalParamExtractor("sofplus")
    with pytest.raises(ValueError, match="malformed scale_mapping 'biased_softplus_x'"):
        fd.NormalParamExtractor("biased_softplus_x")


def test_bad_calls():
    head, td = _head(), _normal_td()
    with pytest.raises(ValueError, match="unknown interaction type 'rnd'"):
        head(None, td, interaction="rnd")

    def tanh_normal(loc, scale):
        return D.TransformedDistribution(D.Normal(loc, scale), [D.TanhTransform()])

    th = _head(distribution_class=tanh_normal)
    with pytest.raises(NotImplementedError, match="TransformedDistribution has no mode"):
        th(None, td, interaction="mode")
    with pytest.raises(NotImplementedError, match=r"has no mean.*needs a key"):
        th(None, td, interaction="mean")
    with pytest.raises(KeyError, match="lacks the sample 'action' to score"):
        head.log_prob(None, td)
    with pytest.raises(KeyError, match="lacks the sample 'action' to score"):
        _policy().log_prob(_policy().init(KEY), _td())


def test_example_runs(capsys):
    import pathlib
    import runpy

    path = pathlib.Path(__file__).parents[1] / "examples" / "probabilistic_policy.py"
    runpy.run_path(str(path), run_name="__main__")
    assert "8 keys -> action[0, 0]" in capsys.readouterr().out


@pytest.mark.parametrize("it", ["deterministic", "random", "mode", "mean"])
def test_normal_fast_path_equals_the_generic_path(it):
    fast = _head(return_log_prob=True)
    generic = _head(
        distribution_class=lambda loc, scale: D.Normal(loc, scale), return_log_prob=True
    )
    assert fast._normal is not None and generic._normal is None
    td = _normal_td()
    assert_close(
        fast(None, td, key=KEY, interaction=it),
        generic(None, td, key=KEY, interaction=it),
        rtol=0,
        atol=0,
    )
    keys = fd.random.split(KEY, 3)
    vf = torch.func.vmap(lambda k: fast(None, td, key=k, interaction=it))(keys)
    vg = torch.func.vmap(lambda k: generic(None, td, key=k, interaction=it))(keys)
    assert_close(vf, vg, rtol=0, atol=0)


def test_invalid_normal_parameters_raise_torchs_error():
    td = fd.TensorDict({"loc": torch.zeros(2), "scale": torch.tensor([1.0, 0.0])}, [2])
    before = D.Distribution._validate_args  # (torch.compile of a distribution turns it off)
    D.Distribution.set_default_validate_args(True)
    try:
        with pytest.raises(ValueError, match="Expected parameter scale"):
            _head()(None, td)
    finally:
        D.Distribution.set_default_validate_args(before)


@pytest.mark.cuda
def test_cuda_policy_draws_the_same_numbers_as_cpu():
    pol, td = _policy(), _td()
    params = pol.init(KEY)
    cpu = pol(params, td, key=KEY, interaction=RANDOM)
    gpu = pol(params.to("cuda"), td.to("cuda"), key=KEY.to("cuda"), interaction=RANDOM)
    assert_close(gpu.to("cpu"), cpu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(), (4,), (3, 5), (1000,)])
@pytest.mark.parametrize("fn", ["normal", "uniform", "gumbel", "split", "fold_in"])
def test_eager_fast_paths_of_random_are_bitwise_the_traced_path(fn, shape):
    """The eager shortcuts (Python-int threefry under 16 hashes, stacked erf_inv) give
    the bits of the path vmap and compile take."""
    f = {
        "normal": lambda k: fd.random.normal(k, shape),
        "uniform": lambda k: fd.random.uniform(k, shape),
        "gumbel": lambda k: fd.random.gumbel(k, shape),
        "split": lambda k: fd.random.split(k, max(1, math.prod(shape))),
        "fold_in": lambda k: fd.random.fold_in(k, 7),
    }[fn]
    keys = fd.random.split(fd.random.key(3), 2)
    eager = torch.stack([f(k) for k in keys])
    assert torch.equal(eager, torch.func.vmap(f)(keys))


@pytest.mark.parametrize(
    ("loc", "scale", "match"),
    [
        (float("nan"), 1.0, "parameter loc"),  # torch's constructor check
        (0.0, -1.0, "parameter scale"),
        (float("-inf"), float("inf"), "within the support"),  # the draw is NaN: log_prob's
    ],
)
def test_normal_head_random_invalid_params_raise_torchs_error(loc, scale, match):
    # the fast Normal path tests validity once after the draw; bad inputs still meet
    # the error torch.distributions.Normal raises for them
    head = fd.Probabilistic(["loc", "scale"], ["action"], D.Normal, return_log_prob=True)
    td = fd.TensorDict({"loc": torch.full((4,), loc), "scale": torch.full((4,), scale)}, [4])
    before = D.Distribution._validate_args  # (torch.compile of a distribution turns it off)
    D.Distribution.set_default_validate_args(True)
    try:
        with pytest.raises(ValueError, match=match):
            head(None, td, key=fd.random.key(0), interaction=fd.InteractionType.RANDOM)
    finally:
        D.Distribution.set_default_validate_args(before)


def _x():
    return fd.TensorDict({"x": torch.randn(2, 3)}, [2])


def test_probabilistic_sequential_rejects_extra_entries():
    pol = fd.ProbabilisticSequential(
        fd.Module(nn.Linear(3, 4), ["x"], ["h"]),
        fd.Module(fd.NormalParamExtractor(), ["h"], ["loc", "scale"]),
        fd.Probabilistic(["loc", "scale"], ["action"], torch.distributions.Normal),
    )
    params = fd.from_module(pol)
    bad = params.set("9", params["0"])
    full = pol(params, _x())
    for m in (pol, pol[:2], pol[:1], pol.select_out_keys("action")):
        with pytest.raises(KeyError, match=r"unexpected entry '9'"):
            m(bad, full)
    td = _x()
    assert_close(pol[1:](params, pol[:1](params, td))["action"], pol(params, td)["action"])

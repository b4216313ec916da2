"""``str`` subclasses and ``enum.StrEnum`` keys behave as their string value everywhere:
TensorDict, Module, Sequential and its plan; a subclass's own ``__repr__``/``__eq__``/
``__hash__`` never reaches functd (keys are stored as plain ``str``). A missing,
misplaced or malformed key raises an error that lists the keys there are, says where a
nested key broke, and leaves the TensorDict unchanged."""

import enum
import sys

import pytest
import torch
from torch import nn

import functd as fd
from functd._modules._plan import plan_source, reference
from functd.testing import assert_close
from tests._support.snapshot import unchanged_example

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # the same behaviour on 3.10

    class StrEnum(str, enum.Enum):
        def __str__(self):
            return self.value


class K(StrEnum):
    X = "x"
    H = "h"
    Y = "y"
    OBS = "obs"
    POS = "pos"


class Evil(str):
    """A str subclass whose repr is code and whose str, eq and hash lie."""

    def __repr__(self):
        return "__import__('os').system('echo pwned'); raise SystemExit('pwned')  #"

    def __str__(self):
        return "not-the-value"

    def __eq__(self, other):
        return False

    def __hash__(self):
        return 12345


def _plain_keys(td):
    return all(
        type(k) is str for k in td.keys(True, False) for k in (k if isinstance(k, tuple) else (k,))
    )


@pytest.mark.parametrize("kind", ["enum", "evil"])
def test_tensordict_treats_keys_as_their_value(kind):
    X, Y, OBS, POS = (
        (K.X, K.Y, K.OBS, K.POS) if kind == "enum" else map(Evil, ["x", "y", "obs", "pos"])
    )
    x, p = torch.randn(3, 2), torch.randn(3, 1)
    td = fd.TensorDict({X: x, OBS: {POS: p}}, [3])
    assert td.keys() == ("x", "obs") and _plain_keys(td)
    assert td[X] is x and td["x"] is x and td.get(X) is x and td[OBS, POS] is p
    assert td[(OBS, POS)] is p and td.get(("obs", POS)) is p
    assert X in td and (OBS, POS) in td
    assert repr(td) == "TensorDict(batch_size=[3], fields={obs: TensorDict(batch_size=[3], fields={pos: f32[1]}), x: f32[2]})"  # fmt: skip
    t2 = td.set(Y, x).set((OBS, Y), p)
    assert t2.keys(True) == ("x", "obs", ("obs", "pos"), ("obs", "y"), "y") and _plain_keys(t2)
    assert td.select(X).keys() == ("x",) and td.select((OBS, POS)).keys(True) == (
        "obs",
        ("obs", "pos"),
    )
    assert td.exclude(X).keys() == ("obs",) and td.exclude((OBS, POS))["obs"].keys() == ()
    r = td.rename({X: Y})
    assert r.keys() == ("obs", "y") and _plain_keys(r)
    u = td.update({Y: x, OBS: {Y: p}})
    assert u.keys(True) == ("x", "obs", ("obs", "pos"), ("obs", "y"), "y") and _plain_keys(u)
    assert fd.TensorDict.from_dict({X: x}).keys() == ("x",)
    assert_close(fd.stack([td, td])[0], td)


def test_a_key_and_its_value_together_are_a_duplicate():
    with pytest.raises(ValueError, match=r"the key 'x' appears twice .*StrEnum"):
        fd.TensorDict({K.X: torch.zeros(2), Evil("x"): torch.ones(2)}, [2])


class A(StrEnum):
    H = "h"


def _block(X, H, Y, arg="h"):
    return fd.Sequential(
        fd.Module(nn.Linear(2, 4), [X], [H]),
        fd.Module(torch.relu, [H], [Y]),
        fd.Module(lambda a, b: a.sum(-1, keepdim=True) + b, {Y: "a", X: "b"}, [("out", Y)]),
        fd.Module(lambda h: h * 2, {H: arg}, [Evil("z")]),  # an argument name too
        selected_out_keys=[("out", Y), Y, "z"],
    )


@pytest.mark.parametrize("kind", ["enum", "evil"])
def test_modules_sequential_and_plan_treat_keys_as_their_value(kind):
    keys = (K.X, K.H, K.Y, A.H) if kind == "enum" else (*map(Evil, "xhy"), "h")
    seq, ref = _block(*keys), _block("x", "h", "y")
    assert seq.in_keys == ref.in_keys and seq.out_keys == ref.out_keys
    relu = fd.Module(torch.relu, [keys[1]], [keys[2]])
    assert relu == fd.Module(torch.relu, ["h"], ["y"]) and hash(relu) == hash(ref.modules[1])
    assert all(type(k) is str for k in seq.in_keys + seq.modules[0].out_keys)
    params = fd.from_module(ref)
    td = fd.TensorDict({"x": torch.randn(5, 2)}, [5])
    want = reference(ref, params, td)
    for m in (seq, ref):
        out = m(params, td)  # through the plan
        assert out.keys(True) == want.keys(True)
        assert_close(out, want)
        assert_close(reference(m, params, td), want)
        assert_close(m.modules[0](params["0"], td), ref.modules[0](params["0"], td))
    src = plan_source(seq, td, params=params)
    assert "pwned" not in src and "K." not in src and "<" not in src
    assert_close(seq(params, x=td["x"]), ref(params, x=td["x"]))  # the keyword call


def test_probabilistic_keys_as_their_value():
    class P(StrEnum):
        LOC = "loc"
        SCALE = "scale"
        ACT = "action"

    pol = fd.ProbabilisticSequential(
        fd.Module(nn.Linear(2, 2), [K.X], [P.LOC]),
        fd.Module(lambda loc: loc.exp(), [P.LOC], [P.SCALE]),
        fd.Probabilistic(
            [P.LOC, P.SCALE], [P.ACT], torch.distributions.Normal, return_log_prob=True
        ),
    )
    params = fd.from_module(pol)
    out = pol(params, fd.TensorDict({"x": torch.randn(3, 2)}, [3]))
    assert set(out.keys()) == {"x", "loc", "scale", "action", "action_log_prob"}
    assert all(type(k) is str for k in out.keys())  # noqa: SIM118 (a TensorDict iterates its batch)
    assert_close(out["action"], out["loc"])


def test_an_argument_name_with_its_own_eq_is_its_value():
    m = fd.Module(lambda h: h * 2, {"x": Evil("h")}, ["y"])
    td = fd.TensorDict({"x": torch.ones(2)}, [2])
    assert_close(m(None, td)["y"], 2 * td["x"])


@pytest.fixture
def td():
    """A nested TensorDict the test must leave unchanged (checked at teardown)."""
    yield from unchanged_example()


# ------------------------------------------------------------------ key errors
def test_missing_key_lists_existing_keys(td):
    with pytest.raises(KeyError, match=r"no key 'nope'; it has: 'x', 'obs'"):
        td["nope"]
    with pytest.raises(KeyError, match=r"no key 'nope'; it has: 'x', 'obs'"):
        td.get("nope")


def test_missing_nested_key_says_where_it_broke(td):
    with pytest.raises(KeyError, match=r"\('obs', 'vel'\).*broke after 'obs' \(level 1\).*'pos'"):
        td["obs", "vel"]
    with pytest.raises(KeyError, match=r"no key \('a', 'b'\); it has: 'x', 'obs'"):
        td.get(("a", "b"))


def test_key_through_a_leaf(td):
    with pytest.raises(KeyError, match=r"goes through 'x', which is a Tensor"):
        td["x", "y"]
    with pytest.raises(KeyError, match=r"cannot set \('x', 'y'\): 'x' holds a Tensor"):
        td.set(("x", "y"), torch.zeros(5))
    with pytest.raises(KeyError, match=r"cannot set \('obs', 'pos', 'z'\): \('obs', 'pos'\)"):
        td.set(("obs", "pos", "z"), torch.zeros(5))


@pytest.mark.parametrize("key", [3, 1.5, ("obs", 1), (b"x",), None, ["x"]])
def test_bad_key_type(td, key):
    with pytest.raises(TypeError, match=r"keys are str or non-empty tuples of str"):
        td.get(key)
    with pytest.raises(TypeError, match=r"keys are str or non-empty tuples of str"):
        td.set(key, torch.zeros(5))


def test_bad_key_in_source():
    x = torch.zeros(3)
    source = {1: x}
    with pytest.raises(TypeError, match=r"got 1 of type int"):
        fd.TensorDict(source, [3])
    assert source == {1: x} and source[1] is x
    with pytest.raises(TypeError, match=r"keys must be str; got the tuple \('a', 'b'\).*Nest"):
        fd.TensorDict({("a", "b"): x}, [3])
    with pytest.raises(TypeError, match=r"nested mapping keys must be str"):
        fd.TensorDict({"a": {("b",): x}}, [3])


def test_bad_source():
    with pytest.raises(TypeError, match=r"takes a mapping.*got a list"):
        fd.TensorDict([torch.zeros(3)], [3])


def test_empty_tuple_key(td):
    with pytest.raises(KeyError, match=r"empty tuple.*td\[\.\.\.\]"):
        td[()]
    with pytest.raises(KeyError, match=r"empty tuple"):
        td.get(())
    with pytest.raises(KeyError, match=r"empty tuple"):
        td.set((), torch.zeros(5))
    with pytest.raises(KeyError, match=r"empty tuple"):
        td.select(())


def test_mixed_key_and_batch_index(td):
    with pytest.raises(TypeError, match=r"mixes keys and batch indices.*td\['x'\]\[\.\.\.\]"):
        td["x", 0]
    with pytest.raises(TypeError, match=r"mixes keys and batch indices"):
        td[0, "x"]

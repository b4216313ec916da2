"""functd.testing: assert_close and the hypothesis strategies."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import functd as fd
from functd.testing import (
    EXAMPLES,
    assert_close,
    batch_shapes,
    example_tensordicts,
    tensordicts,
)


def make():
    return fd.TensorDict({"x": torch.zeros(5, 3), "obs": {"pos": torch.ones(5, 2)}}, [5])


def depth(td):
    sub = [depth(v) for v in td.values() if isinstance(v, fd.TensorDict)]
    return 1 + max(sub, default=0)


# ------------------------------------------------------------------ assert_close
def test_passes_on_equal_trees():
    assert_close(make(), make())
    assert_close({"a": make(), "b": [torch.ones(2)]}, {"a": make(), "b": [torch.ones(2)]})
    assert_close(make().apply(lambda x: x + 1e-7), make())  # within tolerance


def test_fails_on_changed_leaf_naming_path():
    other = make().set(("obs", "pos"), torch.full((5, 2), 2.0))
    with pytest.raises(AssertionError, match=r"leaf at \('obs', 'pos'\) differs"):
        assert_close(other, make())
    with pytest.raises(AssertionError, match=r"leaf at \('x',\) differs"):
        assert_close(make().set("x", torch.zeros(5, 3, dtype=torch.float64)), make())


def test_fails_on_missing_key_naming_it():
    with pytest.raises(AssertionError, match=r"keys only in expected: \[\('obs', 'pos'\)\]"):
        assert_close(make().exclude(("obs", "pos")).set(("obs", "v"), torch.ones(5)), make())
    with pytest.raises(AssertionError, match=r"keys only in actual: \[\('y',\)\]"):
        assert_close(make().set("y", torch.ones(5)), make())


def test_fails_on_batch_size():
    a = fd.TensorDict({"x": torch.zeros(5, 3)}, [5])
    b = fd.TensorDict({"x": torch.zeros(5, 3)}, [5, 3])
    with pytest.raises(AssertionError, match=r"batch sizes differ at the root: \[5\] vs \[5, 3\]"):
        assert_close(a, b)
    assert_close(a, b, check_batch_size=False)
    na = fd.TensorDict({"c": fd.TensorDict({"y": torch.zeros(2, 3)}, [2])}, [2])
    nb = fd.TensorDict({"c": fd.TensorDict({"y": torch.zeros(2, 3)}, [2, 3])}, [2])
    with pytest.raises(AssertionError, match=r"batch sizes differ at \('c',\)"):
        assert_close(na, nb)


def test_tolerances_and_nan():
    a = make().set("x", torch.full((5, 3), float("nan")))
    with pytest.raises(AssertionError, match="'x'"):
        assert_close(a, a)
    assert_close(a, a, equal_nan=True)
    assert_close(make().apply(lambda x: x + 0.01), make(), atol=0.1, rtol=0)


# ------------------------------------------------------------------ corpus
def test_example_corpus():
    ex = example_tensordicts()
    assert tuple(ex) == EXAMPLES
    assert {"empty", "nested", "batch_2x3", "mixed_dtypes", "scalar_batch"} <= set(ex)
    assert ex["batch_2x3"].batch_size == torch.Size([2, 3])
    assert ex["empty"].is_empty()
    assert len({v.dtype for v in ex["mixed_dtypes"].values()}) >= 3
    for name, td in example_tensordicts().items():
        assert_close(td, ex[name])  # deterministic


# ------------------------------------------------------------------ strategies
@given(tensordicts(batch_shape=(2, 3)))
def test_fixed_batch_shape(td):
    assert td.batch_size == torch.Size([2, 3])
    for v in td.values(True, True):
        assert v.shape[:2] == (2, 3)


@given(tensordicts(batch_shape=batch_shapes(max_dims=2, max_side=2)))
def test_batch_shape_strategy(td):
    assert td.batch_dims <= 2 and all(1 <= s <= 2 for s in td.batch_size)


@given(tensordicts(batch_shape=st.just((4,)), max_depth=1))
def test_max_depth_one_is_flat(td):
    assert all(not isinstance(v, fd.TensorDict) for v in td.values())
    assert td.batch_size == torch.Size([4])


@given(tensordicts(max_depth=3))
def test_max_depth(td):
    assert depth(td) <= 3


@given(tensordicts(dtypes=(torch.int64, torch.bool), min_keys=1, max_depth=1))
def test_dtypes(td):
    assert {v.dtype for v in td.values(True, True)} <= {torch.int64, torch.bool}
    assert len(td.keys()) >= 1


@given(tensordicts(min_keys=2, max_keys=3, max_depth=1, max_feature_dims=1, max_side=2))
def test_key_count_and_feature_dims(td):
    assert 2 <= len(td.keys()) <= 3
    for v in td.values():
        assert v.ndim - td.batch_dims <= 1 and all(s <= 2 for s in v.shape[td.batch_dims :])


def test_strategy_reaches_depth_and_dtypes():
    seen_depths, seen_dtypes = set(), set()

    @given(tensordicts(max_depth=3, dtypes=(torch.float64, torch.int32), min_keys=1))
    def collect(td):
        seen_depths.add(depth(td))
        seen_dtypes.update(v.dtype for v in td.values(True, True))

    collect()
    assert max(seen_depths) >= 2
    assert seen_dtypes == {torch.float64, torch.int32}


# ------------------------------------------------------------------ compile assertions
def _twice(x):
    return x * 2


def test_count_compiles_counts_fd_jit():
    j = fd.jit(_twice, backend="fx", dynamic=False)
    with fd.testing.count_compiles() as c:
        j(torch.ones(2))
        j(torch.ones(2))
        assert c.jit == 1  # live inside the block
        j(torch.ones(3))
    j(torch.ones(4))  # after the block: not counted
    assert (c.jit, c.torch, c.total) == (2, 0, 2)
    assert "jit=2" in repr(c)


def test_assert_max_compiles_block_and_wrapper_forms():
    with fd.testing.assert_max_compiles(1):
        fd.jit(_twice, backend="fx")(torch.ones(2))
    j = fd.jit(_twice, backend="fx", dynamic=False)
    with (
        pytest.raises(AssertionError, match=r"at most 1 compilation\(s\), got 2"),
        fd.testing.assert_max_compiles(1),
    ):
        j(torch.ones(2))
        j(torch.ones(3))
    checked = fd.testing.assert_max_compiles(fd.jit(_twice, backend="fx", dynamic=False), 2)
    checked(torch.ones(2))
    checked(torch.ones(3))
    checked(torch.ones(3))
    with pytest.raises(AssertionError, match=r"_twice: expected at most 2 compilation"):
        checked(torch.ones(4))
    with pytest.raises(TypeError, match=r"give the most compilations n"):
        fd.testing.assert_max_compiles(_twice)


@pytest.mark.compile
def test_count_compiles_counts_torch_compile_and_graph_breaks():
    torch._dynamo.reset()

    def breaks(x):
        y = x + 1
        print("", end="")  # a graph break
        return y * 2

    with fd.testing.count_compiles() as c:
        torch.compile(_twice, backend="eager")(torch.ones(2))
    assert (c.torch, c.graph_breaks) == (1, 0)
    with pytest.raises(AssertionError, match="graph break"), fd.testing.assert_no_graph_break():
        torch.compile(breaks, backend="eager")(torch.ones(2))
    torch._dynamo.reset()


def test_variants_parametrize_and_transform():
    mark = fd.testing.variants("eager", "vmap", backend="fx")
    assert mark.args[0] == "variant" and [str(v) for v in mark.args[1]] == ["eager", "vmap"]
    with pytest.raises(ValueError, match="unknown variant 'pmap'"):
        fd.testing.Variant("pmap")
    m = fd.Module(torch.nn.Linear(3, 2), ["x"], ["y"])
    params, td = m.init(0), fd.TensorDict({"x": torch.randn(4, 3)}, [4])
    for name in fd.testing.VARIANTS:
        out = fd.testing.Variant(name, backend="fx")(m)(params, td)
        assert_close(out, m(params, td), rtol=1e-5, atol=1e-6)


def test_grad_variant_runs_under_grad():
    seen = []

    def f(x):
        seen.append(torch._C._functorch.peek_interpreter_stack() is not None)
        return x.sin()

    out = fd.testing.Variant("grad")(f)(torch.ones(3))
    assert_close(out, torch.ones(3).sin())
    assert seen == [True]

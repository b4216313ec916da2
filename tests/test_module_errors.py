"""An error raised inside a module's function names the module (issue 39, item 6).

torch's own message for a layer given a wrong input names no module and no key. A
Module re-raises it as the same type, naming the module (inside a Sequential, its
position), the keys it read with their shapes and dtypes, its params, and torch's
message, which stays the error's ``__cause__``: compared here with the error
torch's own module raises on the same input. Under fd.vmap, fd.grad and fd.jit the
module is named too; dynamo's errors and functd's own errors go through as they were.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import functd as fd


def _torch_error(module: nn.Module, *args: torch.Tensor) -> BaseException:
    """The error torch's own module raises on ``args`` (the reference message)."""
    with pytest.raises(Exception) as info:
        module(*args)
    return info.value


def _td(**xs: torch.Tensor) -> fd.TensorDict:
    return fd.TensorDict(xs, [next(iter(xs.values())).shape[0]])


def test_lowered_linear_with_a_wrong_feature_width_names_module_key_and_shapes():
    net = nn.Linear(3, 8)
    lin = fd.Module(net, ["x"], ["h"])
    assert isinstance(lin.fn, fd.nn.Linear)  # lowered: functd's layer raises
    x = torch.randn(5, 4)
    td, before = _td(x=x), x.clone()
    want = _torch_error(net, x)
    with pytest.raises(
        RuntimeError,
        match=r"^Module\(Linear -> 'h'\) failed on its input 'x' float32\[5, 4\] \(params: "
        r"weight float32\[8, 3\], bias float32\[8\]\) \(check their shapes and dtypes\): "
        r"mat1 and mat2 shapes cannot be multiplied \(5x4 and 3x8\)$",
    ) as info:
        lin(fd.from_module(lin), td)
    assert type(info.value) is RuntimeError  # caught as before
    assert type(info.value.__cause__) is type(want)
    assert str(info.value.__cause__) == str(want)  # torch's error, as its own module raises it
    assert torch.equal(td["x"], before) and list(td.keys()) == ["x"]  # nothing is changed


def test_conv2d_with_wrong_channels_names_the_module_and_the_input_shape():
    net = nn.Conv2d(3, 4, 3)
    conv = fd.Module(net, ["img"], ["feat"])
    x = torch.randn(2, 5, 8, 8)
    want = _torch_error(net, x)
    with pytest.raises(
        RuntimeError,
        match=r"^Module\(Conv2d -> 'feat'\) failed on its input 'img' float32\[2, 5, 8, 8\] "
        r"\(params: weight float32\[4, 3, 3, 3\], bias float32\[4\]\).*: Given groups=1, "
        r"weight of size \[4, 3, 3, 3\], expected input\[2, 5, 8, 8\] to have 3 channels",
    ) as info:
        conv(fd.from_module(conv), _td(img=x))
    assert str(info.value.__cause__) == str(want)


class _Net(nn.Module):  # not lowered: run by torch.func.functional_call
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.body(x).relu() * scale


def test_wrapped_torch_module_with_a_dtype_mismatch_names_inputs_and_dtypes():
    net = _Net()
    m = fd.Module(net, {"obs": "x", "s": "scale"}, ["y"])
    x, s = torch.randn(2, 3, dtype=torch.float64), torch.ones(2, 1)
    want = _torch_error(net, x, s)
    with pytest.raises(
        RuntimeError,
        match=r"^Module\(_Net -> 'y'\) failed on its inputs 'obs' float64\[2, 3\], 's' "
        r"float32\[2, 1\] \(params: body\.weight float32\[3, 3\], body\.bias float32\[3\]\)"
        r".*: mat1 and mat2 must have the same dtype",
    ) as info:
        m(fd.from_module(m), _td(obs=x, s=s))
    assert str(info.value.__cause__) == str(want)


def test_wrapped_hf_model_given_float_ids_names_the_module():
    T = pytest.importorskip("transformers")
    cfg = T.GPT2Config(
        vocab_size=50, n_positions=8, n_embd=8, n_layer=1, n_head=2,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = T.GPT2Model(cfg).eval()
    m = fd.Module(model, {"ids": "input_ids"}, ["last_hidden_state"])
    ids = torch.zeros(2, 4)  # float ids: the embedding refuses them
    want = _torch_error(model, ids)
    with pytest.raises(
        type(want),
        match=r"^Module\(GPT2Model -> 'last_hidden_state'\) failed on its input 'ids' "
        r"float32\[2, 4\] \(params: .*\.\.\. \(\d+ more\)\)",
    ) as info:
        m(fd.from_module(m), _td(ids=ids))
    assert str(info.value.__cause__) == str(want)


def _three() -> tuple[fd.Sequential, fd.TensorDict, torch.Tensor]:
    """A Sequential whose last Linear expects 3 features and gets 8."""
    seq = fd.Sequential(
        fd.Module(nn.Linear(4, 8), ["x"], ["h"]),
        fd.Module(torch.relu, ["h"], ["h"]),
        fd.Module(nn.Linear(3, 2), ["h"], ["y"]),
    )
    return seq, _td(x=torch.randn(5, 4)), seq.init(fd.random.key(0))


_IN_SEQ = (
    r"^Module\(Linear -> 'y'\) \(module 2 of Sequential\(3 modules -> 'h', 'y'\)\) failed "
    r"on its input 'h' float32\[5, 8\] \(params: weight float32\[2, 3\], bias "
    r"float32\[2\]\).*: mat1 and mat2 shapes cannot be multiplied \(5x8 and 3x2\)$"
)


def test_inside_a_sequential_the_position_is_named_by_the_plan_and_the_loop():
    seq, td, params = _three()
    for _ in range(2):  # the first call builds the plan, the second reuses it
        with pytest.raises(RuntimeError, match=_IN_SEQ):
            seq(params, td)
    with pytest.raises(RuntimeError, match=_IN_SEQ):  # the child loop
        seq.apply_with_state(params, td)
    with pytest.raises(RuntimeError, match=_IN_SEQ):  # keyed: the loop's options path
        seq(params, td, key=fd.random.key(1))


def test_a_nested_sequential_names_both_positions_innermost_first():
    inner = fd.Sequential(
        fd.Module(nn.Linear(8, 8), ["h"], ["z"]),
        fd.Module(nn.Linear(3, 2), ["z"], ["w"]),
        selected_out_keys=["w"],  # kept whole: not spliced into the outer one
    )
    outer = fd.Module(nn.Linear(4, 8), ["x"], ["h"]) >> inner
    assert len(outer) == 2
    with pytest.raises(
        RuntimeError,
        match=r"^Module\(Linear -> 'w'\) \(module 1 of Sequential\(2 modules -> 'w'\), in "
        r"module 1 of Sequential\(2 modules -> 'h', 'w'\)\) failed on its input 'z'",
    ):
        outer(outer.init(fd.random.key(0)), _td(x=torch.randn(5, 4)))


def test_a_child_without_params_is_named_by_its_position_in_the_loop():
    inner = fd.Sequential(
        fd.Module(nn.Linear(4, 4), ["x"], ["h"]),
        fd.Module(lambda h: h @ torch.ones(3, 1), ["h"], ["w"]),  # no params
        selected_out_keys=["w"],  # kept whole: its own loop runs it
    )
    outer = fd.Module(torch.tanh, ["x"], ["x2"]) >> inner
    with pytest.raises(
        RuntimeError,
        match=r"^Module\(lambda -> 'w'\) \(module 1 of Sequential\(2 modules -> 'w'\), in "
        r"module 1 of Sequential\(2 modules -> 'x2', 'w'\)\) failed on its input 'h' "
        r"float32\[5, 4\] \(check their shapes and dtypes\): mat1 and mat2 shapes",
    ):
        outer(outer.init(fd.random.key(0)), _td(x=torch.randn(5, 4)))


def test_under_vmap_the_module_and_one_examples_shapes_are_named():
    seq, td, params = _three()
    with pytest.raises(
        RuntimeError,
        match=r"^Module\(Linear -> 'y'\) \(module 2 of Sequential\(3 modules -> 'h', 'y'\)\) "
        r"failed on its input 'h' float32\[8\] .*mat1 and mat2 shapes cannot be multiplied",
    ):
        fd.vmap(lambda td: seq(params, td))(td)


def test_under_grad_the_module_is_named():
    seq, td, params = _three()
    with pytest.raises(RuntimeError, match=_IN_SEQ):
        fd.grad(lambda p: seq(p, td)["y"].sum())(params)


def test_under_jit_the_trace_error_names_the_op_and_the_module():
    """fd.jit's own error (a TransformError naming the op and the argument paths) stays
    what it was, and now quotes the module and its position."""
    seq, td, params = _three()
    f = fd.jit(lambda p, td: seq(p, td)["y"], backend="fx")
    with pytest.raises(
        fd.TransformError,
        match=r"aten\.addmm\.default refuses its operands .*mat2: float32\[3, 2\] \(from "
        r"args\[0\]\['2'\]\['weight'\]\).*: Module\(Linear -> 'y'\) \(module 2 of "
        r"Sequential\(3 modules -> 'h', 'y'\)\) failed on its input 'h' float32\[5, 8\]",
    ):
        f(params, td)
    assert f.cache_info().compiles == 0


def test_errors_the_function_raises_as_its_own_type_are_not_rewritten():
    class MyError(ValueError):
        pass

    def refuse(x: torch.Tensor) -> torch.Tensor:
        raise MyError("my own check")

    m = fd.Module(refuse, ["x"], ["y"])
    with pytest.raises(MyError, match=r"^my own check$") as info:
        m(None, _td(x=torch.zeros(2)))
    assert info.value.__cause__ is None


def test_functds_own_errors_around_the_call_are_unchanged():
    seq, td, params = _three()
    with pytest.raises(KeyError, match=r"reads 'x', which the tensordict lacks"):
        seq(params, _td(other=torch.zeros(5, 4)))
    with pytest.raises(TypeError, match=r"has parameters but was given nothing as params"):
        seq(None, td)
    two = fd.Module(lambda x: x, ["x"], ["a", "b"])  # one output for two out_keys
    with pytest.raises(Exception, match=r"^(?!.*failed on its input)") as info:
        (two >> fd.Module(torch.relu, ["a"], ["c"]))(None, td)
    assert info.value.__cause__ is None


def test_a_plain_function_error_names_the_module_too():
    m = fd.Module(lambda x, y: x @ y, ["a", "b"], ["c"])
    with pytest.raises(
        RuntimeError,
        match=r"^Module\(lambda -> 'c'\) failed on its inputs 'a' float32\[2, 3\], 'b' "
        r"int64\[2, 3\] \(check their shapes and dtypes\): ",
    ):
        m(None, _td(a=torch.zeros(2, 3), b=torch.zeros(2, 3, dtype=torch.long)))


def test_a_distribution_refusing_its_arguments_names_the_head_and_its_position():
    from torch import distributions as D

    head = fd.Probabilistic(["loc", "scale"], ["a"], distribution_class=D.Normal)
    policy = fd.ProbabilisticSequential(
        fd.Module(nn.Linear(3, 2), ["x"], ["loc"]),
        fd.Module(lambda loc: -loc.abs() - 1, ["loc"], ["scale"]),  # negative scales
        head,
    )
    td = _td(x=torch.zeros(5, 3))
    before = D.Distribution._validate_args  # (torch.compile of a distribution turns it off)
    D.Distribution.set_default_validate_args(True)
    try:
        _refused(policy, td)
    finally:
        D.Distribution.set_default_validate_args(before)


def _refused(policy: fd.ProbabilisticSequential, td: fd.TensorDict) -> None:
    with pytest.raises(
        ValueError,
        match=r"^Probabilistic\(Normal -> 'a'\) \(module 2 of ProbabilisticSequential\(3 "
        r"modules -> 'loc', 'scale', 'a'\)\) failed on its inputs 'loc' float32\[5, 2\], "
        r"'scale' float32\[5, 2\] \(check their shapes, dtypes and values\): Expected "
        r"parameter scale",
    ) as info:
        policy(policy.init(fd.random.key(0)), td, key=fd.random.key(1))
    assert type(info.value) is ValueError and type(info.value.__cause__) is ValueError


@pytest.mark.compile
def test_dynamo_errors_go_through_unchanged():
    seq, td, params = _three()
    f = torch.compile(lambda p, td: seq(p, td)["y"], backend="eager", fullgraph=True)
    with pytest.raises(RuntimeError) as info:
        f(params, td)
    assert type(info.value).__module__.startswith("torch._dynamo")
    assert "failed on its input" not in str(info.value)

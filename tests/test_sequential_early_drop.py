"""A Sequential with selected outputs frees each intermediate after its last use
(the hot path); the result is the same as keeping everything to the end."""

import torch

import functd as fd
from functd.testing import assert_close

P = fd.TensorDict({})  # params given (even empty) and no key: the hot path


def chain(sel):
    return fd.Sequential(
        fd.Module(torch.sin, ["x"], ["h"]),
        fd.Module(torch.cos, ["h"], ["z"]),
        fd.Module(lambda h, z: h * z, ["h", "z"], ["w"]),  # h is read again after z
        fd.Module(lambda x, w: x + w, ["x", "w"], ["y"]),
        fd.Module(torch.neg, ["y"], ["h"]),  # h written again, then dropped
        selected_out_keys=sel,
    )


def test_early_drop_same_result_and_keeps_what_later_modules_read():
    x = torch.randn(4, 3)
    td = fd.TensorDict({"x": x}, [4])
    full = chain(None)(P, td)
    for sel in (["y"], ["w", "y"], ["h"], ["z"]):
        out = chain(sel)(P, td)
        assert set(out.keys()) == {"x", *sel}
        assert_close(out, full.select("x", *sel))
    assert_close(full["w"], torch.sin(x) * torch.cos(torch.sin(x)))
    # the slow path (a key given) drops at the end: same outputs
    assert_close(chain(["y"])(None, td, key=fd.random.key(0)), chain(["y"])(P, td))
    # and under vmap
    assert_close(fd.vmap(lambda t: chain(["y"])(P, t))(td), chain(["y"])(P, td))

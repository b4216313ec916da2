import torch

import functd as fd


def test_set_returns_new_and_keeps_input():
    td = fd.TensorDict({"x": torch.zeros(2)}, [2])
    td2 = td.set("y", torch.ones(2))
    assert "y" in td2 and "y" not in td

"""Checked by mypy (`make lint`), never run: the public API's types as users see them.

``assert_type`` fails the type check when an expression's static type differs.
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import assert_type

import functd as fd

td = fd.TensorDict({"x": torch.zeros(5, 3), "obs": {"pos": torch.zeros(5, 2)}}, [5])

# a key gives an entry: a tensor or a nested TensorDict
assert_type(td["x"], Tensor | fd.TensorDict)
assert_type(td["obs", "pos"], Tensor | fd.TensorDict)
assert_type(td.get("x"), Tensor | fd.TensorDict)
assert_type(td.get("z", None), Tensor | fd.TensorDict | None)

# an index of the batch dims gives a TensorDict
assert_type(td[0], fd.TensorDict)
assert_type(td[1:3], fd.TensorDict)
assert_type(td[torch.tensor([True, False, True, False, True])], fd.TensorDict)

# every write returns a new TensorDict
assert_type(td.set("y", torch.zeros(5, 1)), fd.TensorDict)
assert_type(td.select("x"), fd.TensorDict)
assert_type(td.exclude("x"), fd.TensorDict)
assert_type(td.update({"x": torch.ones(5, 3)}), fd.TensorDict)
assert_type(td.rename({"x": "x0"}), fd.TensorDict)
assert_type(td.apply(torch.neg), fd.TensorDict)
assert_type(td.to("cpu"), fd.TensorDict)
assert_type(td.batch_size, torch.Size)
assert_type(fd.stack([td, td]), fd.TensorDict)
assert_type(fd.cat([td, td]), fd.TensorDict)

# narrowing an entry
x = td["x"]
if isinstance(x, Tensor):
    assert_type(x.sum(), Tensor)

# modules, keys, optimizers, files
model = fd.Module(torch.nn.Linear(3, 4), ["x"], ["h"])
params = model.init(fd.random.key(0))
assert_type(params, fd.TensorDict)
assert_type(fd.from_module(model), fd.TensorDict)
assert_type(fd.random.split(fd.random.key(0), 4), Tensor)
opt = fd.optim.adam(1e-3)
assert_type(opt, fd.optim.GradientTransformation)
assert_type(opt.init(params), fd.TensorDict)
fd.save(params, "w.safetensors")
assert_type(fd.__version__, str)

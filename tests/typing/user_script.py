"""A typed user script: mypy --strict checks it (``make typecheck``); never run.

Written as a user would: a model, its params, a loss reading tensor leaves with
``td.get_tensor``, ``fd.grad``/``fd.value_and_grad``, ``fd.vmap``, ``fd.jit``, an
optimizer step and ``fd.random`` keys, with no casts. ``assert_type`` pins the types
functd's annotations give (a wrong one fails the check).
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import assert_type

import functd as fd

key = fd.random.key(0)
assert_type(key, Tensor)
k_init, k_data, k_drop = fd.random.split(key, 3)
assert_type(fd.random.split(key), Tensor)
assert_type(fd.random.fold_in(key, 3), Tensor)

model = fd.Sequential(
    fd.Module(torch.nn.Linear(3, 16), in_keys=["x"], out_keys=["h"]),
    fd.Module(torch.nn.Tanh(), in_keys=["h"], out_keys=["h"]),
    fd.Module(torch.nn.Linear(16, 1), in_keys=["h"], out_keys=["pred"]),
)
params = model.init(k_init)
assert_type(params, fd.TensorDict)

x = fd.random.normal(k_data, (32, 3))
data = fd.TensorDict({"x": x, "y": x.sum(-1, keepdim=True)}, [32])
out = model(params, data)
assert_type(out, fd.TensorDict)
assert_type(out.get_tensor("pred"), Tensor)


def loss_fn(params: fd.TensorDict, batch: fd.TensorDict) -> Tensor:
    pred = model(params, batch).get_tensor("pred")
    return ((pred - batch.get_tensor("y")) ** 2).mean()


def loss_with_aux(params: fd.TensorDict, batch: fd.TensorDict) -> tuple[Tensor, fd.TensorDict]:
    out = model(params, batch)
    loss = ((out.get_tensor("pred") - out.get_tensor("y")) ** 2).mean()
    return loss, out


grads = fd.grad(loss_fn)(params, data)
assert_type(grads, fd.TensorDict)
grads2, aux = fd.grad(loss_with_aux, has_aux=True)(params, data)
assert_type(grads2, fd.TensorDict)
assert_type(aux, fd.TensorDict)
value, grads3 = fd.value_and_grad(loss_fn)(params, data)
assert_type(value, Tensor)
assert_type(grads3, fd.TensorDict)
(value2, aux2), grads4 = fd.value_and_grad(loss_with_aux, has_aux=True)(params, data)
assert_type(value2, Tensor)
assert_type(aux2, fd.TensorDict)
assert_type(grads4, fd.TensorDict)

# an ensemble: init vmapped over keys, a call vmapped over members
ens = fd.vmap(model.init)(fd.random.split(k_init, 4))
assert_type(ens, fd.TensorDict)
ens_out = fd.vmap(model, in_dims=(0, None))(ens, data)
assert_type(ens_out, fd.TensorDict)
per_member = fd.vmap(loss_fn, in_dims=(0, None))(ens, data)
assert_type(per_member, Tensor)

# a compiled step
optimizer = fd.optim.chain(fd.optim.clip_by_global_norm(1.0), fd.optim.adam(1e-2))
opt_state = optimizer.init(params)
assert_type(opt_state, fd.TensorDict)


@fd.jit
def step(
    params: fd.TensorDict, opt_state: fd.TensorDict, batch: fd.TensorDict
) -> tuple[fd.TensorDict, fd.TensorDict, Tensor]:
    loss, grads = fd.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return fd.optim.apply_updates(params, updates), opt_state, loss


params, opt_state, loss = step(params, opt_state, data)
assert_type(loss, Tensor)
assert_type(step.cache_size(), int)
jitted_loss = fd.jit(loss_fn, donate_argnums=())
assert_type(jitted_loss(params, data), Tensor)
first_loss = float(loss)

# keyed dropout: a key per call, folded per step
drop = fd.Module(torch.nn.Dropout(0.1), in_keys=["x"], out_keys=["x"])
dropped = drop(drop.init(k_drop), data, key=fd.random.fold_in(k_drop, 1))
assert_type(dropped.get_tensor("x"), Tensor)


# a scan over steps
def body(carry: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    return carry + x, carry


final, partial = fd.scan(body, torch.zeros(3), x)
assert_type(final, Tensor)
assert_type(partial, Tensor)
assert_type(fd.fori_loop(0, 3, lambda i, c: c + i, torch.zeros(2)), Tensor)
assert_type(fd.while_loop(lambda c: c.sum() < 5, lambda c: c + 1, torch.zeros(2)), Tensor)


# a transformation of one's own: plain functions fit GradientTransformation's fields
def sign_init(params: fd.TensorDict) -> fd.TensorDict:
    return fd.TensorDict({}, [])


def sign_update(
    updates: fd.TensorDict, state: fd.TensorDict, params: fd.TensorDict | None = None
) -> tuple[fd.TensorDict, fd.TensorDict]:
    return updates.apply(lambda g: -0.01 * g.sign()), state


sign_sgd = fd.optim.GradientTransformation(sign_init, sign_update)
updates, _ = sign_sgd.update(grads, sign_sgd.init(params))
assert_type(fd.optim.apply_updates(params, updates), fd.TensorDict)
assert_type(params.get_tensordict("0"), fd.TensorDict)
assert_type(params.get_tensordict("0").get_tensor("weight"), Tensor)

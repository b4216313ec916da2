"""An ensemble of 16 MLPs in functd: one fd.vmap to initialise, one to evaluate.

1. 16 independent initialisations: fd.vmap(mlp.init) over 16 keys.
2. Evaluate on shared data (in_dims=(0, None)) and on data per member (0, 0).
3. Per-member gradients of a regression loss, in one call.
4. The same computation as a Python loop over 16 torch nn.Modules holding the
   same weights: equal outputs and gradients, and the speed-up.

Run with `make demo` (or `.venv/bin/python examples/ensembles.py`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils.benchmark import Timer

import functd as fd

MEMBERS, BATCH = 16, 64


def make_mlp() -> tuple[fd.Sequential, nn.Sequential]:
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    mlp = fd.Sequential(
        fd.Module(net[0], ["x"], ["h0"]),
        fd.Module(net[1], ["h0"], ["a0"]),
        fd.Module(net[2], ["a0"], ["h1"]),
        fd.Module(net[3], ["h1"], ["a1"]),
        fd.Module(net[4], ["a1"], ["y"]),
        selected_out_keys=["y"],
    )
    return mlp, net


def ms(fn: Callable[[], object]) -> float:
    fn()
    return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.3).median * 1e3


def main() -> None:
    torch.manual_seed(0)
    mlp, template = make_mlp()

    # 1. sixteen initialisations in one call: the key is the mapped input
    keys = fd.random.split(fd.random.key(0), MEMBERS)
    ens = fd.vmap(mlp.init)(keys)
    print(f"## ensemble params (one fd.vmap over {MEMBERS} keys)\n{ens}")

    # 2. shared data and data per member
    x = torch.randn(BATCH, 4)
    td = fd.TensorDict({"x": x}, [BATCH])
    shared = fd.vmap(mlp, in_dims=(0, None))(ens, td)
    per_member = fd.TensorDict({"x": torch.randn(MEMBERS, BATCH, 4)}, [MEMBERS, BATCH])
    own = fd.vmap(mlp, in_dims=(0, 0))(ens, per_member)
    print(f"\n## shared data -> {shared.batch_size}; data per member -> {own.batch_size}")
    spread = shared["y"].std(0).mean()
    print(f"members disagree on the same inputs (mean std of y across members: {spread:.3f})")

    # 3. per-member gradients of a regression loss
    target = torch.sin(x.sum(-1, keepdim=True))

    def loss(params: fd.TensorDict, td: fd.TensorDict) -> torch.Tensor:
        return ((mlp(params, td).get_tensor("y") - target) ** 2).mean()

    losses, grads = fd.vmap(fd.value_and_grad(loss), in_dims=(0, None))(ens, td)
    print(f"\n## per-member losses\n{losses}")
    print(f"gradients, shaped like the ensemble: {grads}")

    # 4. the same with 16 torch modules and a Python loop
    nets = [fd.to_module(p, copy.deepcopy(template)) for p in fd.unstack(ens)]

    def loop_forward() -> torch.Tensor:
        return torch.stack([net(x) for net in nets])

    def loop_grads() -> list[tuple[torch.Tensor, ...]]:
        out = []
        for net in nets:
            ps = list(net.parameters())
            out.append(torch.autograd.grad(((net(x) - target) ** 2).mean(), ps))
        return out

    with torch.no_grad():
        torch.testing.assert_close(shared["y"], loop_forward())
    ref = loop_grads()
    torch.testing.assert_close(grads["0", "weight"], torch.stack([g[0] for g in ref]))
    torch.testing.assert_close(grads["4", "bias"], torch.stack([g[-1] for g in ref]))
    print("\noutputs and gradients equal a loop over 16 nn.Modules with the same weights")

    fwd = lambda: fd.vmap(mlp, in_dims=(0, None))(ens, td)  # noqa: E731
    bwd = lambda: fd.vmap(fd.grad(loss), in_dims=(0, None))(ens, td)  # noqa: E731
    with torch.no_grad():
        t_fd, t_loop = ms(fwd), ms(loop_forward)
    g_fd, g_loop = ms(bwd), ms(loop_grads)
    print(
        f"\n## speed ({MEMBERS} members, batch {BATCH}, {torch.get_num_threads()} threads)\n"
        f"forward:   fd.vmap {t_fd:.2f} ms, loop {t_loop:.2f} ms -> {t_loop / t_fd:.2f}x\n"
        f"gradients: fd.vmap {g_fd:.2f} ms, loop {g_loop:.2f} ms -> {g_loop / g_fd:.2f}x"
    )


if __name__ == "__main__":
    main()

"""An ensemble of 16 MLPs in functd: one fd.vmap to initialise, one to evaluate.

1. 16 independent initialisations: fd.vmap(mlp.init) over 16 keys.
2. Evaluate on shared data (in_dims=(0, None)) and on data per member (0, 0).
3. Per-member gradients of a regression loss, in one call.
4. The same computation as a Python loop over 16 torch nn.Modules holding the
   same weights: equal outputs and gradients, and the speed ratio, measured in
   interleaved rounds (the two take turns, so a change of the machine's load hits
   both alike) and reported as the median of the per-round ratios.

Run with `make demo` (or `.venv/bin/python examples/ensembles.py`).
"""

from __future__ import annotations

import copy
import statistics

import torch
import torch.nn as nn
from _timing import interleaved

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


def ratio(slow: list[float], fast: list[float]) -> tuple[float, float, float]:
    """Median and quartiles (lower, upper) of the per-round ratios slow / fast."""
    lo, med, hi = statistics.quantiles([s / f for s, f in zip(slow, fast)], n=4)
    return med, lo, hi


def speed_line(what: str, t: dict[str, list[float]]) -> str:
    med, lo, hi = ratio(t["loop"], t["vmap"])
    ms = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    # "faster"/"slower" only when the middle half of the rounds agree, by 2% at least
    verdict = "faster" if lo > 1.02 else "slower" if hi < 0.98 else "the same within noise"
    return (
        f"{what:10} fd.vmap {ms['vmap']:.2f} ms, loop {ms['loop']:.2f} ms -> fd.vmap "
        f"{med:.2f}x the loop's speed (middle half of the rounds: {lo:.2f}..{hi:.2f}): {verdict}"
    )


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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see below
    try:
        with torch.no_grad():
            t_fwd = interleaved({"vmap": fwd, "loop": loop_forward})
        t_bwd = interleaved({"vmap": bwd, "loop": loop_grads})
    finally:
        torch.set_num_threads(threads)
    print(f"\n## speed ({MEMBERS} members, batch {BATCH}, 1 thread; CPU time, median of 11 "
          "interleaved rounds)")  # fmt: skip
    print(speed_line("forward:", t_fwd))
    print(speed_line("gradients:", t_bwd))
    print(
        "fd.vmap runs one batched matmul per layer for all members where the loop runs one "
        "per member;\nat this small size the difference is mostly per-call overhead (16 "
        "module calls against one\nvmapped call). One thread for both: on a shared machine "
        "OpenMP's threads wait on each other\nand the figure would measure the load, not "
        "the code."
    )


if __name__ == "__main__":
    main()

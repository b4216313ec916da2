"""Fit an MLP to a noisy 1-D function with a pure training loop.

Everything is explicit: the parameters and the optimizer state are
TensorDicts, the randomness comes from `fd.random` keys, and one training step
is the pure function `fd.train_step(loss_fn, optimizer)`. `fd.fit` runs the
epochs with a progress line per epoch and returns the loss history.

Prints the loss curve as text; saves `train_regression.png` when matplotlib is
installed. Run: `python examples/train_regression.py` (QUICK=1: a short run;
JIT=1: the step compiled with `fd.jit`, once, before the first epoch).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import torch

import functd as fd

QUICK = os.environ.get("QUICK", "0") == "1"
JIT = os.environ.get("JIT", "0") == "1"
EPOCHS = 15 if QUICK else 60
N, BATCH = 512, 64


def target(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(3 * x) * x


def make_data(key: torch.Tensor) -> fd.TensorDict:
    kx, kn = fd.random.split(key)
    x = fd.random.uniform(kx, (N, 1), minval=-2.0, maxval=2.0)
    y = target(x) + 0.1 * fd.random.normal(kn, (N, 1))
    return fd.TensorDict({"x": x, "y": y}, [N])


def epoch_batches(data: fd.TensorDict, key: torch.Tensor) -> Callable[[int], list[fd.TensorDict]]:
    """A function epoch -> list of shuffled minibatches (a fresh order per epoch)."""

    def batches(epoch: int) -> list[fd.TensorDict]:
        order = fd.random.permutation(fd.random.fold_in(key, epoch), N)
        shuffled = data[order]
        return [shuffled[i : i + BATCH] for i in range(0, N, BATCH)]

    return batches


def text_curve(losses: list[float], width: int = 50) -> str:
    lo, hi = math.log(min(losses)), math.log(max(losses))
    lines = []
    for i, loss in enumerate(losses):
        frac = (math.log(loss) - lo) / (hi - lo) if hi > lo else 1.0
        lines.append(f"  epoch {i + 1:3d} {loss:9.5f} " + "#" * max(1, round(frac * width)))
    return "\n".join(lines)


def main() -> dict[str, float]:
    """Train and print; returns the first and last epochs' mean loss and the grid MSE."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread's OpenMP waits cost more
    try:
        return _main()
    finally:
        torch.set_num_threads(threads)


def _main() -> dict[str, float]:
    key = fd.random.key(0)
    k_data, k_init, k_shuffle = fd.random.split(key, 3)
    data = make_data(k_data)

    model = fd.Module(
        fd.nn.MLP(1, 1, num_cells=(64, 64), activation=fd.nn.Tanh()),
        in_keys=["x"],
        out_keys=["pred"],
    )
    params = model.init(k_init)

    def loss_fn(params: fd.TensorDict, batch: fd.TensorDict, key: torch.Tensor) -> torch.Tensor:
        pred = model(params, batch).get_tensor("pred")
        return ((pred - batch.get_tensor("y")) ** 2).mean()

    steps_per_epoch = N // BATCH
    schedule = fd.optim.warmup_cosine_decay(
        1e-3, 1e-2, warmup_steps=steps_per_epoch, decay_steps=EPOCHS * steps_per_epoch
    )
    optimizer = fd.optim.chain(fd.optim.clip_by_global_norm(1.0), fd.optim.adam(schedule))
    step: Callable[..., tuple[fd.TensorDict, fd.TensorDict, fd.TensorDict]]
    step = fd.train_step(loss_fn, optimizer)
    batches = epoch_batches(data, k_shuffle)
    if JIT:  # compile now (a pure step: this call changes nothing), then every step reuses it
        step = fd.jit(step)
        start = time.perf_counter()
        step(params, optimizer.init(params), batches(0)[0], None)
        print(f"fd.jit compiled the training step in {time.perf_counter() - start:.1f} s")

    params, opt_state, history = fd.fit(
        step,
        params,
        optimizer.init(params),
        batches,
        epochs=EPOCHS,
        print_every=max(1, EPOCHS // 5),
    )
    per_epoch = history["loss"].reshape(EPOCHS, steps_per_epoch).mean(-1).tolist()
    print("\nloss per epoch (log scale):")
    print(text_curve(per_epoch))

    grid = torch.linspace(-2, 2, 200).unsqueeze(-1)
    pred = model(params, x=grid)
    mse = ((pred - target(grid)) ** 2).mean().item()
    print(f"\nMSE against the noiseless function on a grid: {mse:.4f}")
    print(f"optimizer steps: {int(opt_state['1', 'count'])}")
    assert per_epoch[-1] < per_epoch[0] / 3, "the loss should have dropped"
    figures = {"first_loss": per_epoch[0], "last_loss": per_epoch[-1], "mse": mse}

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return figures
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 4))
    ax0.scatter(data["x"].squeeze(-1), data["y"].squeeze(-1), s=4, alpha=0.4, label="data")
    ax0.plot(grid.squeeze(-1), target(grid).squeeze(-1), label="target")
    ax0.plot(grid.squeeze(-1), pred.detach().squeeze(-1), label="MLP")
    ax0.legend()
    ax1.semilogy(history["loss"].tolist())
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    fig.tight_layout()
    fig.savefig("train_regression.png", dpi=100)
    print("saved train_regression.png")
    return figures


if __name__ == "__main__":
    main()

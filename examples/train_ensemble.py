"""Train an ensemble of 8 MLPs at once with `torch.func.vmap`, each member with
its own initialization and its own learning rate, and read the uncertainty off
the spread of their predictions.

The learning rates live in the optimizer state (`fd.optim.inject_hyperparams`),
so one vmapped training step updates all members. The data has a gap in the
middle: the members agree where there is data and disagree in the gap and
beyond its ends.

Run: `python examples/train_ensemble.py` (QUICK=1: a short run).
"""

from __future__ import annotations

import os

import torch

import functd as fd

QUICK = os.environ.get("QUICK", "0") == "1"
MEMBERS = 8
EPOCHS = 30 if QUICK else 80
N, BATCH = 256, 64


def target(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(2 * x)


def make_data(key: torch.Tensor) -> fd.TensorDict:
    kx, kn, ks = fd.random.split(key, 3)
    x = fd.random.uniform(kx, (N, 1), minval=0.5, maxval=2.0)
    x = x * torch.where(fd.random.bernoulli(ks, 0.5, (N, 1)), 1.0, -1.0)  # two blobs, a gap
    y = target(x) + 0.05 * fd.random.normal(kn, (N, 1))
    return fd.TensorDict({"x": x, "y": y}, [N])


def main() -> dict[str, list[float]]:
    """Train and print; returns each member's first and last epoch's mean loss and the
    spread of the predictions on and off the data."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread's OpenMP waits cost more
    try:
        return _main()
    finally:
        torch.set_num_threads(threads)


def _main() -> dict[str, list[float]]:
    key = fd.random.key(1)
    k_data, k_init, k_shuffle = fd.random.split(key, 3)
    data = make_data(k_data)
    model = fd.Module(
        fd.nn.MLP(1, 1, num_cells=(32, 32), activation=fd.nn.Tanh()),
        in_keys=["x"],
        out_keys=["pred"],
    )

    def loss_fn(params: fd.TensorDict, batch: fd.TensorDict, key: torch.Tensor) -> torch.Tensor:
        return ((model(params, batch).get_tensor("pred") - batch.get_tensor("y")) ** 2).mean()

    # one set of params per member (batch size [8]), each from its own key
    ensemble = torch.func.vmap(model.init)(fd.random.split(k_init, MEMBERS))
    optimizer = fd.optim.inject_hyperparams(fd.optim.adam)(lr=1e-3)
    lrs = torch.logspace(-3, -1.5, MEMBERS)
    opt_state = torch.func.vmap(optimizer.init)(ensemble).set(("hyperparams", "lr"), lrs)

    # params and state mapped over members; the batch and key shared
    step = torch.func.vmap(fd.train_step(loss_fn, optimizer), in_dims=(0, 0, None, None))

    def batches(epoch: int) -> list[fd.TensorDict]:
        shuffled = data[fd.random.permutation(fd.random.fold_in(k_shuffle, epoch), N)]
        return [shuffled[i : i + BATCH] for i in range(0, N, BATCH)]

    ensemble, opt_state, history = fd.fit(
        step, ensemble, opt_state, batches, epochs=EPOCHS, print_every=max(1, EPOCHS // 5)
    )

    print("\ntraining loss per member (mean of the first epoch -> of the last):")
    first = history["loss"][: N // BATCH].mean(0)
    last = history["loss"][-(N // BATCH) :].mean(0)
    for lr, l0, l1 in zip(opt_state["hyperparams", "lr"].tolist(), first.tolist(), last.tolist()):
        print(f"  lr {lr:.5f}: {l0:.4f} -> {l1:.4f}")

    grid = torch.linspace(-3, 3, 13).unsqueeze(-1)
    preds = torch.func.vmap(lambda p: model(p, x=grid))(ensemble).squeeze(-1)  # [8, 13]
    mean, std = preds.mean(0), preds.std(0)
    print("\n    x   target    mean     std   region")
    for x, t, m, s in zip(grid.squeeze(-1), target(grid).squeeze(-1), mean, std):
        region = "data" if 0.5 <= abs(x) <= 2.0 else ("gap" if abs(x) < 0.5 else "outside")
        print(f"  {x:5.1f}  {t:6.3f}  {m:6.3f}  {s:6.3f}   {region}")
    inside = std[(grid.squeeze(-1).abs() >= 0.5) & (grid.squeeze(-1).abs() <= 2.0)].mean()
    outside = std[grid.squeeze(-1).abs() > 2.0].mean()
    print(f"\nmean spread: {inside:.3f} on the data, {outside:.3f} beyond it")
    assert outside > inside, "the members should disagree more away from the data"
    return {
        "first_loss": first.tolist(),
        "last_loss": last.tolist(),
        "spread": [float(inside), float(outside)],
    }


if __name__ == "__main__":
    main()

"""Issue 24's two checks of the PPO agents that take minutes, so they are not tests.

- independence (default): agent 0 of an N-agent float64 run ends with the params of the
  1-agent run with the same seed (target: within 1e-8; N=64, 16,384 env steps each).
- learning (``--learning``): N agents x S env steps each (target: 16 x 500k, mean final
  return >= 450; CartPole-v1's maximum is 500). About 7 minutes eager on 2 cores.

Run: ``python benchmarks/ppo_checks.py [--learning] [--agents N] [--steps S] [--jit]``.
``make bench`` runs the independence check (about a minute).
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time

import optree
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location(
        "ppo_agents_checks", ROOT / "examples" / "ppo_agents.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def independence(P, n: int, steps: int, jit: bool) -> float:
    cfg = P.Config(steps=steps, dtype=torch.float64)
    big, _, _, t_big = P.run(cfg, n, 0, torch.full((n,), cfg.lr), jit, False)
    one, _, _, t_one = P.run(cfg, 1, 0, torch.full((1,), cfg.lr), jit, False)
    a = optree.tree_leaves(big["params"][0], namespace="functd")
    b = optree.tree_leaves(one["params"][0], namespace="functd")
    diff = max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))
    print(
        f"independence: agent 0 of {n} vs alone, float64, {steps} env steps, jit={jit}: "
        f"max |params diff| = {diff:.3e} (target <= 1e-8; train {t_big:.1f} s / {t_one:.1f} s)"
    )
    return diff


def learning(P, n: int, steps: int, jit: bool) -> torch.Tensor:
    cfg = P.Config(steps=steps)
    runner, _, warm, train_s = P.run(cfg, n, 0, torch.full((n,), cfg.lr), jit, False)
    final = P.final_return_batch(runner)
    print(
        f"learning: {n} agents x {steps} env steps, jit={jit}: train {train_s:.0f} s "
        f"(+{warm:.0f} s), final return min {final.min():.1f} mean {final.mean():.1f} "
        f"max {final.max():.1f} (target: mean >= 450)"
    )
    return final


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--learning", action="store_true", help="the learning check instead")
    p.add_argument("--agents", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--jit", action="store_true", help="compile the update with fd.jit")
    args = p.parse_args()
    torch.set_num_threads(1)
    P = _example()
    t0 = time.perf_counter()
    if args.learning:
        learning(P, args.agents or 16, args.steps or 500_000, args.jit)
    else:
        independence(P, args.agents or 64, args.steps or 16_384, args.jit)
    print(f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

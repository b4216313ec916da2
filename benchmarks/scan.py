"""fd.scan: compile time of a GRU-policy rollout against its length, and eager per-step cost.

Rows:
- ``fd.jit`` compile time (trace + inductor, cold: a fresh process with its own empty
  inductor cache) of a rollout of 16 and 256 steps: a hand GRU cell closing over its
  params, a categorical action drawn per step with a key split from a carried key.
  Target (issue 24): compile(256) <= 1.3x compile(16).
- eager time per step of ``fd.scan`` against the same rollout as a Python loop
  (interleaved rounds, grad mode on, process CPU time).

Run: ``.venv/bin/python benchmarks/scan.py`` (~2 min; BENCH_QUICK=1 skips the compiles).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _common import clock_us, machine, table

import functd as fd

H, OBS, ACT = 64, 4, 2


def params(seed: int = 0) -> fd.TensorDict:
    g = torch.Generator().manual_seed(seed)

    def w(*s):
        return torch.randn(*s, generator=g) * 0.1

    return fd.TensorDict(
        {"wi": w(OBS, 3 * H), "wh": w(H, 3 * H), "b": w(3 * H), "wo": w(H, ACT), "bo": w(ACT)}
    )


def gru(p, x, h):
    gi, gh = x @ p["wi"] + p["b"], h @ p["wh"]
    r = torch.sigmoid(gi[..., :H] + gh[..., :H])
    z = torch.sigmoid(gi[..., H : 2 * H] + gh[..., H : 2 * H])
    n = torch.tanh(gi[..., 2 * H :] + r * gh[..., 2 * H :])
    return (1 - z) * n + z * h


def rollout(p, key, obs):
    """fd.scan over obs (T, OBS): carry (h, key), y (action, logit of it)."""

    def step(c, x):
        key, sub = fd.random.split(c["key"])
        h = gru(p, x, c["h"])
        logits = h @ p["wo"] + p["bo"]
        a = fd.random.categorical(sub, logits)
        return {"h": h, "key": key}, {
            "action": a,
            "logp": torch.log_softmax(logits, -1).gather(-1, a[None])[0],
        }

    return fd.scan(step, {"h": torch.zeros(H), "key": key}, obs)


def rollout_loop(p, key, obs):
    h, acts, logps = torch.zeros(H), [], []
    for t in range(obs.shape[0]):
        key, sub = fd.random.split(key)
        h = gru(p, obs[t], h)
        logits = h @ p["wo"] + p["bo"]
        a = fd.random.categorical(sub, logits)
        acts.append(a)
        logps.append(torch.log_softmax(logits, -1).gather(-1, a[None])[0])
    return {"h": h, "key": key}, {"action": torch.stack(acts), "logp": torch.stack(logps)}


def _compile_child(n: int) -> None:
    p, key, obs = params(), fd.random.key(0), torch.randn(n, OBS)
    t0 = time.perf_counter()
    out = fd.jit(rollout)(p, key, obs)
    dt = time.perf_counter() - t0
    ref = rollout_loop(p, key, obs)
    same = bool((out[1]["action"] == ref[1]["action"]).all())
    err = float((out[1]["logp"] - ref[1]["logp"]).abs().max())
    print(json.dumps({"n": n, "compile_s": dt, "same_actions": same, "logp_err": err}))


def compile_rows() -> list[list]:
    rows = []
    for n in (16, 256):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            cmd = [sys.executable, __file__, "--child", str(n)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
    base = rows[0]["compile_s"]
    return [
        [
            f"fd.jit(rollout), {r['n']} steps",
            r["compile_s"],
            r["compile_s"] / base,
            r["same_actions"],
            f"{r['logp_err']:.1e}",
        ]
        for r in rows
    ]


def eager_rows(n: int = 64, rounds: int = 3) -> list[list]:
    p, key, obs = params(), fd.random.key(0), torch.randn(n, OBS)
    fns = {
        "fd.scan": lambda: rollout(p, key, obs),
        "Python loop": lambda: rollout_loop(p, key, obs),
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(clock_us(fn) / n)
    loop = min(times["Python loop"])
    return [[k, min(v), min(v) / loop] for k, v in times.items()]


def main() -> None:
    print(f"# fd.scan ({machine()}; load {os.getloadavg()[0]:.1f})")
    torch.set_num_threads(1)
    with torch.enable_grad():
        rows = eager_rows()
    print(table(["eager rollout (64 steps)", "us/step", "x Python loop"], rows))
    if os.environ.get("BENCH_QUICK"):
        return
    rows = compile_rows()
    hdr = ["cold compile (fresh process, empty inductor cache)", "s", "x 16 steps"]
    print(table([*hdr, "actions == eager", "max |logp - eager|"], rows))
    print(f"# load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        torch.set_num_threads(1)
        _compile_child(int(sys.argv[2]))
    else:
        main()

"""`make gpu-check`: the one prepared run on a lent GPU (issue 40), at most 8 minutes.

First the CUDA tests (``pytest -m cuda``), then the rows of issue 40's table, each step
in its own process with its own time limit (benchmarks/gpu_rows.py: eager draws against
torch.randn/rand, split/fold_in, the RANDOM policy eager and under fd.jit, the compiled
ensemble forward at 64 and 4 members, tutorial block b1 eager / fd.jit's default /
fd.jit(cuda_graph=False), PPO over 2,048 agents eager and under fd.jit). A step that
fails or runs out of time is a row of the report, and the next step runs. Then the
targets of the issue, each with its verdict.

Writes ``gpu-check.json`` and ``gpu-check.md`` (machine, driver, torch, CUDA, triton,
commit; steps; rows; targets) and each step's log into ``$OUT`` when set, else
``gpu-check-out/``. Exit status 1 when a step failed or timed out (a MISSED target is
a verdict, not a failure); without CUDA it says so and exits 0.

Run: ``make gpu-check`` (``PYTHON=python3 make gpu-check`` with a Python that has a
CUDA torch and functd's requirements, e.g. a lent machine's image), or
``python benchmarks/gpu_check.py [--cpu]``. ``--cpu``: every step tiny on the CPU (the
plumbing: fd.jit's "fx" backend, nothing compiled by torch.compile): about a minute of CPU
time. ``GPU_CHECK_BUDGET`` (seconds; 470 on a GPU, 400 with --cpu) scales the steps' limits.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

from _cpu import cpu_model

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CPU = "--cpu" in sys.argv or "--dry-run" in sys.argv
BUDGET = float(os.environ.get("GPU_CHECK_BUDGET", "400" if CPU else "470"))
# (step, share of the budget); the last step gets whatever time is left
STEPS = [
    ("cuda tests", 0.32),
    ("prng", 0.07),
    ("block", 0.08),
    ("policy", 0.08),
    ("ensemble", 0.17),
    ("ppo_eager", 0.10),
    ("ppo_jit", 0.18),
]
# (target, row, reference row or None for an absolute bound, bound on value or ratio)
TARGETS = [
    ("eager fd.random.normal of 1,024 values <= 3x torch.randn", "prng.normal_1024", "prng.torch_normal_1024", 3.0),
    ("eager fd.random.normal of 2**24 values <= 1.2x torch.randn", "prng.normal_big", "prng.torch_normal_big", 1.2),
    ("fd.random.split <= 30 µs", "prng.split", None, 30.0),
    ("fd.random.fold_in <= 30 µs", "prng.fold_in", None, 30.0),
    ("compiled fd.vmap ensemble, 64 members <= 1.1x compiled stack_module_state + vmap", "ensemble.fd_64", "ensemble.sms_64", 1.1),
    ("compiled fd.vmap ensemble, 4 members <= 1.1x compiled stack_module_state + vmap", "ensemble.fd_4", "ensemble.sms_4", 1.1),
    ("tutorial block b1: fd.jit (default) <= 0.6x hand-written eager", "block.jit", "block.hand", 0.6),
]  # fmt: skip


def out_dir() -> str:
    path = os.environ.get("OUT") or os.path.join(ROOT, "gpu-check-out")
    os.makedirs(path, exist_ok=True)
    return path


def _cmd(argv: list[str], timeout: float = 10) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        return done.stdout.strip() if done.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict:
    import torch

    cpu = cpu_model()
    try:
        from importlib.metadata import version

        triton = version("triton")
    except Exception:
        triton = "not installed"
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": "none (--cpu dry run)" if CPU else torch.cuda.get_device_name(0),
        "driver": "n/a" if CPU else _cmd(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "triton": triton,
        "python": platform.python_version(),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "commit": _cmd(["git", "rev-parse", "--short", "HEAD"]),
    }  # fmt: skip
    return info


def execute(argv: list[str], limit: float, log: str, env: dict | None = None) -> str:
    """Run ``argv`` with its output in the file ``log``: "ok", "FAILED (rc N)" or
    "TIMEOUT after N s" (the process is killed at ``limit`` seconds)."""
    with open(log, "w") as f:
        try:
            done = subprocess.run(
                argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=limit
            )
        except subprocess.TimeoutExpired:
            return f"TIMEOUT after {limit:.0f} s"
    return "ok" if done.returncode == 0 else f"FAILED (rc {done.returncode})"


def step_argv(name: str, rows: str) -> list[str]:
    if name == "cuda tests":  # --cpu: one file's CUDA tests (they skip): the plumbing
        files = [os.path.join(ROOT, "tests", "test_jit_cuda_graph.py")] if CPU else []
        pytest = ["pytest", "-v", "-rfE", "-m", "cuda", "-p", "no:cacheprovider"]
        return [sys.executable, "-m", *pytest, *files]
    tiny = ["--tiny"] if CPU else []
    return [sys.executable, os.path.join(HERE, "gpu_rows.py"), name, rows, *tiny]


_VERBOSE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")


def _progress(lines: list[str]) -> str:
    """Without pytest's summary (it was stopped): the results of ``-v``'s lines so far."""
    done = [m.group(2) for m in map(_VERBOSE.match, lines) if m]
    counts = {k: done.count(k) for k in dict.fromkeys(done)}
    return ", ".join(f"{n} {k.lower()}" for k, n in counts.items()) + " (before it stopped)"


def _failures(lines: list[str]) -> list[str]:
    """The failed tests: pytest's ``-rfE`` summary, or ``-v``'s lines when it was stopped."""
    summary = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    verbose = [f"{m.group(2)} {m.group(1)}" for m in map(_VERBOSE.match, lines) if m]
    return (summary or [v for v in verbose if v.startswith(("FAILED", "ERROR"))])[:50]


def run_step(name: str, limit: float, out: str) -> dict:
    """Run one step in its own process, its output in ``out``/step-NAME.log."""
    log = os.path.join(out, f"step-{name.replace(' ', '-')}.log")
    rows = os.path.join(out, f"rows-{name}.jsonl")
    env = {**os.environ, "BENCH_DEVICE": "cpu" if CPU else "cuda", "HYPOTHESIS_PROFILE": "ci"}
    t0 = time.monotonic()
    result = execute(step_argv(name, rows), limit, log, env)
    step = {"step": name, "result": result, "seconds": round(time.monotonic() - t0, 1)}
    step["log"] = os.path.basename(log)
    with open(log, errors="replace") as f:
        lines = f.read().strip().splitlines()
    if name == "cuda tests":
        counts = re.compile(r"\d+ (passed|failed|skipped|deselected|error)")
        summary = [ln for ln in lines if counts.search(ln)]
        step["note"] = summary[-1].strip("= ") if summary else _progress(lines)
        step["failures"] = _failures(lines)
    elif result != "ok":
        step["note"] = " / ".join(lines[-3:])[-400:]
    step["rows"] = []
    if os.path.exists(rows):
        with open(rows) as f:
            step["rows"] = [json.loads(ln) for ln in f if ln.strip()]
        os.remove(rows)
    return step


def verdicts(rows: dict[str, dict]) -> list[dict]:
    """Each target: what was measured and met / MISSED / not measured."""
    out = []
    for target, rid, ref, bound in TARGETS:
        row, peer = rows.get(rid), rows.get(ref) if ref else None
        if row is None or (ref and peer is None):
            measured, verdict = None, "not measured"
        else:
            measured = row["value"] / peer["value"] if peer else row["value"]
            verdict = "met" if measured <= bound else "MISSED"
            if CPU:
                verdict += " (CPU dry run: no verdict)"
        unit = "x" if ref else rows[rid]["unit"] if rid in rows else ""
        out.append(
            {
                "target": target,
                "measured": measured,
                "unit": unit,
                "bound": bound,
                "verdict": verdict,
            }
        )
    return out


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# gpu-check: {m['gpu']}, {m['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in m.items() if k not in ("gpu", "date")]
    lines += [f"- budget: {report['budget_s']:.0f} s; took {report['seconds']:.0f} s", ""]
    lines += ["| step | result | s | note |", "|---|---|---|---|"]
    for s in report["steps"]:
        note = s.get("note", "").replace("|", "/")
        lines.append(f"| {s['step']} | {s['result']} | {s['seconds']:.0f} | {note} |")
    failures = [f for s in report["steps"] for f in s.get("failures", [])]
    if failures:
        lines += ["", "Failed tests:", "", *[f"- `{f}`" for f in failures]]
    lines += ["", "| row | value | unit | ratio to |", "|---|---|---|---|"]
    by_id = {r["id"]: r for r in report["rows"]}
    for r in report["rows"]:
        peer = by_id.get(r["ref"] or "")
        ratio = (
            f"{r['value'] / peer['value']:.2f}x {peer['label']}" if peer and peer["value"] else ""
        )
        lines.append(f"| {r['label']} | {_num(r['value'])} | {r['unit']} | {ratio} |")
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    for t in report["targets"]:
        got = "" if t["measured"] is None else f"{_num(t['measured'])} {t['unit']}"
        lines.append(f"| {t['target']} | {got} | {t['verdict']} |")
    return "\n".join(lines) + "\n"


def write(report: dict, out: str) -> tuple[str, str]:
    """Write gpu-check.json and gpu-check.md into ``out``; return their paths."""
    paths = os.path.join(out, "gpu-check.json"), os.path.join(out, "gpu-check.md")
    with open(paths[0], "w") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    with open(paths[1], "w") as f:
        f.write(markdown(report))
    return paths


def main() -> int:
    import torch

    if not CPU and not torch.cuda.is_available():
        print("gpu-check: skipped: no CUDA device on this machine (--cpu: a dry run on the CPU)")
        return 0
    out, t0 = out_dir(), time.monotonic()
    report: dict = {"machine": machine(), "budget_s": BUDGET, "steps": [], "rows": []}
    for i, (name, share) in enumerate(STEPS):
        left = BUDGET - (time.monotonic() - t0)
        limit = left if i == len(STEPS) - 1 else min(share * BUDGET, left)
        if limit < 5:
            step = {"step": name, "result": "skipped: out of time", "seconds": 0.0, "rows": []}
        else:
            step = run_step(name, limit, out)
        print(
            f"gpu-check: {name}: {step['result']} ({step['seconds']:.0f} s) {step.get('note', '')}",
            flush=True,
        )
        report["rows"] += step.pop("rows")
        report["steps"].append(step)
        report["seconds"] = time.monotonic() - t0
        report["targets"] = verdicts({r["id"]: r for r in report["rows"]})
        paths = write(report, out)  # after every step: a later hang loses nothing
    with open(paths[1]) as f:
        print(f.read())
    print(f"gpu-check: wrote {paths[0]} and {paths[1]}")
    return 1 if any(s["result"] != "ok" for s in report["steps"]) else 0


if __name__ == "__main__":
    sys.exit(main())

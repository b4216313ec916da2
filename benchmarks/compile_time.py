"""Compile time of fd.jit against torch.compile (and JAX for PPO), cold and warm (issue 36).

Each measurement is one fresh child process that builds its row's function and calls
it once; "compile s" is that first call (the trace and the compile; imports and model
building are before it):

- cold: inductor's caches off (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``, a fresh empty
  ``TORCHINDUCTOR_CACHE_DIR``);
- warm: caches on, in a cache directory a first child (caches on, "fill") filled with
  the same function and signature: what a user who reruns a script waits. "from
  disk": inductor's FX graph cache hits/misses/bypasses in that child (fd.jit's
  ``cache_info().from_disk`` for fd.jit); "warm CPU s" the CPU seconds of that first
  call (the child and the processes it waited for: load-independent, unlike the wall
  seconds on a shared machine); "warm process s" is the warm child's whole life up to
  the end of its first call (interpreter start and imports included).

Rows: the tutorial block at batch 1 (benchmarks/tutorial_block.py), a 2-layer HF BERT
eval call (small random config, batch 8 x 32 tokens; ``attn_implementation="eager"``
and the default, SDPA), an ``fd.jit(fd.train_step(loss, adam))`` step of the block at
batch 256, and examples/ppo_agents.py's update (``fd.vmap(update)``: rollout, GAE,
4 x 4 minibatch steps) at 1 and 64 agents. Each is compiled by ``fd.jit`` and by
``torch.compile`` of the same function; "call" is the compiled call afterwards (median
of this child's CPU time per call, ``_common.clock_us``; ms for PPO), so a faster
compile that runs slower shows. JAX (``benchmarks/ppo_jax.py``, the same PPO,
``jit(vmap(train))``, its ``lower().compile()`` seconds; warm: JAX's persistent
compilation cache in a directory a first run filled) where ``--jax-python`` (or
``/work/venvs/jax/bin/python``) has jax and optax.

Run: ``.venv/bin/python benchmarks/compile_time.py [--rows block,adam,bert-eager,
bert-sdpa,ppo1,ppo64] [--impls fd.jit,torch.compile] [--phases cold,fill,warm]
[--timeout 900]``; the first phase run also times the compiled call.
``BENCH_QUICK=1``: the block and the Adam step only. Threads: BENCH_THREADS (1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import THREADS, clock_us, machine, table

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICK = os.environ.get("BENCH_QUICK", "0") == "1"
ROWS = ["block", "adam", "bert-eager", "bert-sdpa", "ppo1", "ppo64"]
IMPLS = ["fd.jit", "torch.compile"]
JAX_PYTHON = "/work/venvs/jax/bin/python"
_CHILD = "BENCH_CT_CHILD"  # "row:impl" in a child process


# ------------------------------------------------------------------ the rows
def _block(compiler):
    from tutorial_block import ResidualBlock, functd_block

    import functd as fd

    torch.manual_seed(0)
    block, params = functd_block(ResidualBlock())
    x, f = torch.randn(1, 3), compiler(block)
    return lambda: f(params, fd.TensorDict({"x": x}, [1]))


def _adam(compiler):
    from tutorial_block import ResidualBlock, functd_block

    import functd as fd

    torch.manual_seed(0)
    block, params = functd_block(ResidualBlock())
    batch = fd.TensorDict({"x": torch.randn(256, 3), "t": torch.randn(256, 3)}, [256])

    def loss_fn(p, b, key):
        return ((block(p, b)["y"] - b["t"]) ** 2).mean()

    opt = fd.optim.adam(1e-3)
    step, state = compiler(fd.train_step(loss_fn, opt)), opt.init(params)
    return lambda: step(params, state, batch, None)


def _bert(compiler, attn: str | None):
    import transformers as T

    import functd as fd

    torch.manual_seed(0)
    kw = {} if attn is None else {"attn_implementation": attn}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = T.BertConfig(
            num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
            vocab_size=500, max_position_embeddings=64, **kw,
        )  # fmt: skip
        model = T.BertModel(cfg)
    m = fd.nn.eval_mode(fd.Module(model, {"ids": "input_ids"}, ["last_hidden_state"]))
    params, f = fd.from_module(m), compiler(m)
    td = fd.TensorDict({"ids": torch.randint(0, 500, (8, 32))}, [8])
    return lambda: f(params, td)


def _ppo(compiler, agents: int):
    name = "ppo_agents_example"
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "ppo_agents.py")
    P = importlib.util.module_from_spec(spec)
    sys.modules[name] = P
    spec.loader.exec_module(P)
    cfg = P.Config()
    init, update = P.make_driver(cfg, jit=False)  # fd.vmap(update) over the agents
    runner = init(P.agent_keys(0, agents), torch.full((agents,), cfg.lr))
    step = compiler(update)
    return lambda: step(runner)


MAKERS = {
    "block": _block,
    "adam": _adam,
    "bert-eager": lambda c: _bert(c, "eager"),
    "bert-sdpa": lambda c: _bert(c, None),
    "ppo1": lambda c: _ppo(c, 1),
    "ppo64": lambda c: _ppo(c, 64),
}


# ------------------------------------------------------------------ one child
def _cpu() -> float:
    """CPU seconds of this process and of its children waited for (g++, inductor's ISA
    probes); not those of inductor's compile worker pool, which live on."""
    import resource

    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _child(spec: str) -> None:
    """Build ``row`` with ``impl``, time its first call, then (BENCH_CT_SPEED=1) its
    compiled call; one JSON line on stdout."""
    import functd as fd
    from functd._torch.dynamo import counters

    row, impl = spec.split(":")
    torch.set_num_threads(THREADS)
    jitted = []

    def compiler(f):
        out = fd.jit(f) if impl == "fd.jit" else torch.compile(f)
        jitted.append(out)
        return out

    call = MAKERS[row](compiler)
    cpu0, t0 = _cpu(), time.perf_counter()
    call()
    compile_s, cpu_s = time.perf_counter() - t0, _cpu() - cpu0
    process_s = time.time() - float(os.environ["BENCH_CT_T0"])
    c = counters["inductor"]
    out = {
        "compile_s": compile_s,
        "cpu_s": cpu_s,
        "process_s": process_s,
        "hit": c["fxgraph_cache_hit"],
        "miss": c["fxgraph_cache_miss"],
        "bypass": c["fxgraph_cache_bypass"],
    }
    if impl == "fd.jit":
        out["from_disk"] = jitted[0].cache_info().from_disk
    if os.environ.get("BENCH_CT_SPEED") == "1":
        out["call_us"] = clock_us(call, min_run_time=0.5 if row.startswith("ppo") else 0.2)
    print(json.dumps(out), flush=True)


def spawn(row: str, impl: str, cache: str, cold: bool, speed: bool, timeout: float) -> dict:
    """One child: its JSON, or ``{"error": ...}`` (a failure or a timeout)."""
    env = {**os.environ, _CHILD: f"{row}:{impl}", "TORCHINDUCTOR_CACHE_DIR": cache}
    env["BENCH_CT_SPEED"] = "1" if speed else "0"
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    if cold:
        env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    env["BENCH_CT_T0"] = repr(time.time())
    try:
        p = subprocess.run(
            [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        return {"error": (lines[-1] if lines else f"exit {p.returncode}")[:160]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(row: str, impl: str, timeout: float, phases: list[str]) -> dict:
    """cold (caches off), fill and warm (caches on, one directory): the phases asked
    for; the first one run also times the compiled call."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as cold_dir, tempfile.TemporaryDirectory() as warm_dir:
        for phase in phases:
            d = cold_dir if phase == "cold" else warm_dir
            out[phase] = spawn(row, impl, d, phase == "cold", not out, timeout)
            print(f"  {row} {impl} {phase}: {out[phase]}", flush=True)
            if "error" in out[phase]:
                break
    return out


def jax_measure(python: str, agents: int, timeout: float) -> dict:
    """ppo_jax.py at ``agents``: cold (no persistent cache), then fill and warm runs
    sharing a JAX compilation cache directory."""
    cmd = [python, str(ROOT / "benchmarks" / "ppo_jax.py"), "--agents", str(agents)]
    cmd += ["--steps", "1024", "--threads", str(THREADS)]

    def run(cache: str | None) -> dict:
        env = dict(os.environ)
        if cache:
            env["JAX_COMPILATION_CACHE_DIR"] = cache
            env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
            env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": "timeout"}
        for line in p.stdout.splitlines():
            if line.startswith("jax agents="):
                f = dict(kv.split("=") for kv in line.split()[1:])
                # two updates of 4 envs x 128 steps: the run is one compiled call
                return {"compile_s": float(f["compile_s"]), "update_s": float(f["train_s"]) / 2}
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:160]}

    cold = run(None)
    with tempfile.TemporaryDirectory() as d:
        run(d)
        warm = run(d)
    print(f"  ppo{agents} JAX cold: {cold} warm: {warm}", flush=True)
    return {"cold": cold, "warm": warm}


# ------------------------------------------------------------------ the table
def vector_extensions() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return "unknown"
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"]
    wanted += ["amx_tile"]
    return "/".join(f for f in wanted if f in flags) or "none of AVX2/AVX-512"


def _load() -> str:
    try:
        return "/".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "?"


def _cell(d: dict, key: str, fmt: str = "{:.1f}") -> str:
    if "error" in d:
        return "-" if d["error"] == "not run" else "failed"
    return fmt.format(d[key]) if key in d else "-"


def _disk(d: dict) -> str:
    if "error" in d:
        return f"failed ({d['error']})"
    hits = f"{d['hit']} hit, {d['miss']} miss, {d['bypass']} bypass"
    return f"{d['from_disk']} entry ({hits})" if "from_disk" in d else hits


def rows_of(row: str, impl: str, m: dict) -> list:
    none = {"error": "not run"}
    cold, fill, warm = m.get("cold", none), m.get("fill", none), m.get("warm", none)
    first = next(iter(m.values()))
    speed = first.get("call_us")
    if speed is None:
        call = "-"
    elif row.startswith("ppo"):
        call = f"{speed / 1e3:.1f} ms"
    else:
        call = f"{speed:.0f} µs"
    errors = [f"{k}: {v['error']}" for k, v in m.items() if "error" in v]
    return [
        row,
        impl,
        _cell(cold, "compile_s"),
        _cell(fill, "compile_s"),
        _cell(warm, "compile_s"),
        _cell(warm, "cpu_s"),
        _cell(warm, "process_s"),
        _disk(warm) if "warm" in m else "-",
        call,
        "; ".join(errors),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=",".join(ROWS[:2] if QUICK else ROWS))
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--phases", default="cold,fill,warm", help="which children (in order)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    p.add_argument("--jax-python", default=JAX_PYTHON if os.path.exists(JAX_PYTHON) else None)
    args = p.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        p.error(f"--rows: unknown {unknown}; choose from {ROWS}")
    torch.set_num_threads(THREADS)  # the children's (machine() prints it)
    head = f"# compile time ({machine()}; {vector_extensions()}; load {_load()} at the start"
    print(head + ")", flush=True)
    out = []
    for row in rows:
        for impl in args.impls.split(","):
            m = measure(row, impl, args.timeout, args.phases.split(","))
            out.append(rows_of(row, impl, m))
        if row.startswith("ppo") and args.jax_python:
            j = jax_measure(args.jax_python, int(row[3:]), args.timeout)
            call = f"{j['cold']['update_s'] * 1e3:.1f} ms" if "update_s" in j["cold"] else "-"
            cells = [_cell(j["cold"], "compile_s"), "-", _cell(j["warm"], "compile_s"), "-", "-"]
            out.append([row, "JAX jit(vmap(train))", *cells, "JAX cache", call, ""])
    header = ["row", "implementation", "cold s", "fill s", "warm s", "warm CPU s"]
    header += ["warm process s"]
    header += ["warm: from disk", "call", "note"]
    print(f"\n{head}; load {_load()} at the end)\n")
    print(table(header, out))


if __name__ == "__main__":
    if os.environ.get(_CHILD):
        _child(os.environ[_CHILD])
    else:
        main()

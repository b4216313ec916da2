"""Real models through functd against the models' own calls, one run.

Rows (issue 20's targets):
- "eval call": small random HF configs (GPT-2, BERT, ViT) and torch.nn models
  (TransformerEncoder, a 2-layer LSTM, a Conv-BN-ReLU-MaxPool-Dropout CNN) in eval mode,
  grad mode on as by default: ``model(**inputs)`` against
  ``fd.Module(model, {td_key: argument}, [out])(params, td)`` with the TensorDict built
  inside the timed call. Target: <= 1.15x on the HF models.
- "train call (keyed)": training mode, dropout on: torch's call (global generator)
  against functd's call with ``key=`` (every random function answered by KeyedRandom);
  informational: what the keyed masks cost.
- "ensemble memory": 4 members' forward under vmap, torch's ``stack_module_state`` +
  ``vmap(functional_call)`` against ``fd.vmap`` over ``fd.stack`` of the members' params
  (trainable and held-out leaves stacked alike); peak MiB of the CPU allocator during the
  call (``_common.peak_mib``). Target: <= 1.25x for every model.

Times: best of BENCH_ROUNDS interleaved medians of this process's CPU time, BENCH_THREADS=1.
Run: .venv/bin/python benchmarks/real_models.py   (needs transformers for the HF rows)
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
import warnings

import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state

sys.path.insert(0, os.path.dirname(__file__))
from _common import CLOCK, THREADS, clock_us, machine, peak_mib, table

import functd as fd

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
RUN_TIME = float(os.environ.get("BENCH_MIN_RUN_TIME", "0.2"))
MEMBERS = 4
warnings.filterwarnings("ignore", message="There is a performance drop")  # SDPA under vmap


def _hf_models() -> dict:
    if importlib.util.find_spec("transformers") is None:
        return {}
    import transformers as T

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500, (8, 32), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpt2 = T.GPT2Config(
            n_layer=2, n_head=4, n_embd=64, vocab_size=500, n_positions=64,
            bos_token_id=None, eos_token_id=None,
        )  # fmt: skip
        bert = T.BertConfig(
            num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
            vocab_size=500, max_position_embeddings=64,
        )  # fmt: skip
        vit = T.ViTConfig(
            num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
            image_size=32, patch_size=8,
        )  # fmt: skip
    return {
        "GPT-2": (lambda: T.GPT2Model(gpt2), {"input_ids": ids}, "last_hidden_state"),
        "BERT": (lambda: T.BertModel(bert), {"input_ids": ids}, "last_hidden_state"),
        "ViT": (
            lambda: T.ViTModel(vit),
            {"pixel_values": torch.randn(8, 3, 32, 32, generator=g)},
            "last_hidden_state",
        ),
    }


class _CNN(nn.Sequential):
    def __init__(self):
        super().__init__(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(0.2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10),
        )  # fmt: skip


def _torch_models() -> dict:
    g = torch.Generator().manual_seed(1)
    enc = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    return {
        "TransformerEncoder": (
            lambda: nn.TransformerEncoder(copy.deepcopy(enc), 2, enable_nested_tensor=False),
            {"src": torch.randn(8, 32, 64, generator=g)},
            None,
        ),
        "LSTM 2x64": (
            lambda: nn.LSTM(32, 64, num_layers=2, batch_first=True, dropout=0.2),
            {"input": torch.randn(8, 32, 32, generator=g)},
            0,
        ),
        "CNN": (
            lambda: nn.Sequential(*_CNN()),
            {"input": torch.randn(8, 3, 16, 16, generator=g)},
            None,
        ),
    }


def _read(out, field):
    if field is None:
        return out
    return out[field] if isinstance(field, int) else getattr(out, field)


def _wrap(model, inputs, field) -> tuple[fd.Module, str]:
    """The fd.Module and the out_key holding what ``_read`` reads of the model's output
    (a ModelOutput's field is read by key; an LSTM's tuple flattens onto three keys)."""
    ins = {f"td_{k}": k for k in inputs}
    if isinstance(field, str):
        return fd.Module(model, ins, [field]), field
    if field == 0:
        return fd.Module(model, ins, ["out", "h", "c"]).select_out_keys("out"), "out"
    return fd.Module(model, ins, ["out"]), "out"


def _calls(build, inputs: dict, field, mode: str):
    """(torch's call, functd's call) of a fresh model in ``mode``."""
    torch.manual_seed(0)
    model = build()
    model.train(mode == "train")
    m, out = _wrap(model, inputs, field)
    params, key = fd.from_module(m), fd.random.key(0) if mode == "train" else None
    data = {f"td_{k}": v for k, v in inputs.items()}
    bs = [next(iter(inputs.values())).shape[0]]

    def t_call():
        return _read(model(**inputs), field)

    def f_call():
        td = fd.TensorDict(data, bs)
        if m.stateful:  # BatchNorm in training mode: the new statistics too
            return m.apply_with_state(params, td, key=key)[0][out]
        return m(params, td, key=key)[out]

    if mode == "eval":
        torch.testing.assert_close(f_call(), t_call())
    return t_call, f_call


def time_rows(models: dict) -> list[list]:
    best: dict = {}
    for _ in range(ROUNDS):
        for name, (build, inputs, field) in models.items():
            for mode in ("eval", "train"):
                for who, fn in zip(("torch", "functd"), _calls(build, inputs, field, mode)):
                    k = (name, mode, who)
                    best[k] = min(best.get(k, float("inf")), clock_us(fn, RUN_TIME))
    rows = []
    for name in models:
        for mode in ("eval", "train"):
            t, f = best[(name, mode, "torch")], best[(name, mode, "functd")]
            what = "eval call" if mode == "eval" else "train call (keyed)"
            rows.append([name, what, t, f, f / t])
    return rows


def memory_row(name: str, build, inputs: dict, field) -> list:
    torch.manual_seed(0)
    nets = [build().eval() for _ in range(MEMBERS)]
    base = copy.deepcopy(nets[0]).to("meta")
    stacked, buffers = stack_module_state(nets)  # requires grad, as torch's tutorial
    state = {**stacked, **buffers}
    plain = {k: v.detach() for k, v in state.items()}  # the same work as functd's
    t_fwd = torch.func.vmap(lambda p: _read(functional_call(base, p, (), inputs), field))
    m, out = _wrap(nets[0], inputs, field)
    ens = fd.stack([fd.from_module(net) for net in nets])
    td = fd.TensorDict({f"td_{k}": v for k, v in inputs.items()}, [])
    f_fwd = fd.vmap(lambda p: m(p, td)[out])
    fm = peak_mib(lambda: f_fwd(ens))
    try:
        expected = t_fwd(state)
    except RuntimeError as e:  # nn.LSTM: torch has no batching rule for its fused op
        fails = f"fails ({str(e)[:40]}...)"
        return [f"{MEMBERS} x {name}", fails, fails, fm, "-", "-"]
    torch.testing.assert_close(f_fwd(ens), expected, rtol=1e-4, atol=1e-5)
    tm, tp = peak_mib(lambda: t_fwd(state)), peak_mib(lambda: t_fwd(plain))
    return [f"{MEMBERS} x {name}", tm, tp, fm, fm / tm, fm / tp]


def main() -> None:
    torch.set_num_threads(THREADS)
    models = {**_hf_models(), **_torch_models()}
    clock = "CPU time (process clock)" if CLOCK == "process" else "wall time"
    print(f"# Real models ({machine()}); {clock}, best median of {ROUNDS} rounds\n")
    rows = time_rows(models)
    print(table(["model", "call", "torch µs", "functd µs", "functd / torch"], rows))
    print("\n## ensemble memory (peak MiB during the forward)\n")
    mem = [memory_row(name, *spec) for name, spec in models.items()]
    header = ["ensemble", "torch (params require grad)", "torch (detached)", "functd",
              "functd / torch", "functd / torch detached"]  # fmt: skip
    print(table(header, mem))
    hf = [r[4] for r in rows if r[1] == "eval call" and r[0] in ("GPT-2", "BERT", "ViT")]
    print("\ntargets:")
    if hf:
        print(f"  HF eval call <= 1.15x model(x): worst {max(hf):.2f}x "
              f"({'met' if max(hf) <= 1.15 else 'MISSED'})")  # fmt: skip
    worst = max(max(r[4], r[5]) for r in mem if isinstance(r[4], float))
    print(f"  ensemble memory <= 1.25x stack_module_state: worst {worst:.2f}x "
          f"({'met' if worst <= 1.25 else 'MISSED'})")  # fmt: skip


if __name__ == "__main__":
    main()

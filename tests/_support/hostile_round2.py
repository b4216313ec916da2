"""The second hostile battery (issue 41): forged safetensors metadata, huge batch sizes,
full disks, concurrent checkpoint writers and killed writers' leftovers.

``forged_safetensors(folder)`` writes one ``.safetensors`` file per forged metadata
case and returns ``[(name, path, regex)]``: ``fd.load`` must raise a ``ValueError``
that starts with ``functd.load('<path>')`` and matches ``regex``. ``huge_batch_pt`` /
``huge_batch_safetensors`` write an *empty* TensorDict of batch size ``2**40`` (its
indexing once tried a 1 TB allocation). ``python -m tests._support.fsize_save`` is the
file-size-limit child of the tests; ``checkpoint_writer`` the concurrent writer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

import functd as fd

HUGE = 1 << 40  # the forged batch size: 1 TB as one byte a row

_DEEP = 100_000  # brackets of the deeply nested JSON cases (100 KB of metadata)
_DEPTH_IN_RANGE = 300  # tree levels that Python's JSON parser reads, past functd's limit


def _node(**kw: Any) -> dict:
    return kw


def _tree(tree: Any) -> str:
    return json.dumps({"version": 1, "tree": tree})


def _deep_nodes(levels: int) -> str:
    """A valid JSON tree of ``levels`` nested dict nodes (written by hand: json.dumps
    itself recurses)."""
    text = '{"t":"value","value":1}'
    for _ in range(levels):
        text = '{"t":"dict","items":[["a",' + text + "]]}"
    return '{"version":1,"tree":' + text + "}"


_W = _node(t="tensor", name="w")
_FORGED = "damaged or forged at the root: "
_CRCS = r"checksums \(metadata 'functd.crc32'\) are damaged or forged"

# name -> (metadata beyond {"format": "pt"}, the message's regex)
CASES: dict[str, tuple[dict[str, str], str]] = {
    # the checksums
    "crc_a_list": ({"functd.crc32": '["w"]'}, _CRCS + ": a JSON object .* got a list"),
    "crc_deeply_nested": ({"functd.crc32": "[" * _DEEP + "]" * _DEEP}, _CRCS + ": .*not valid"),
    "crc_a_string": ({"functd.crc32": '{"w": "123"}'}, r"CRC-32 of 'w' is '123', not an int"),
    "crc_a_bool": ({"functd.crc32": '{"w": true}'}, r"CRC-32 of 'w' is True, not an int"),
    "crc_past_32_bits": ({"functd.crc32": '{"w": 4294967296}'}, r"is 4294967296, not an int"),
    "crc_a_huge_float": ({"functd.crc32": '{"w": 1e999}'}, r"is inf, not an int"),
    "crc_5000_digits": ({"functd.crc32": '{"w": ' + "9" * 5000 + "}"}, _CRCS + ": .*not valid"),
    "crc_not_json": ({"functd.crc32": "{w"}, _CRCS + ": they are not valid JSON"),
    # the tree
    "tree_deeply_nested_json": (
        {"functd": '{"version":1,"tree":' + "[" * _DEEP + "]" * _DEEP + "}"},
        r"damaged or forged at the root: its JSON nests too deeply",
    ),
    "tree_300_levels": (
        {"functd": _deep_nodes(_DEPTH_IN_RANGE)},
        r"at the key path \('a', 'a', 'a', 'a'\)\.\.\. \(100 levels deep\): it nests deeper",
    ),
    "tree_a_list": ({"functd": '["w"]'}, r"functd metadata is not one this version reads"),
    "tree_version_a_str": ({"functd": '{"version": "1"}'}, r"not one this version reads"),
    "tree_no_tree": ({"functd": '{"version": 1}'}, r"not one this version reads"),
    "tree_node_an_int": ({"functd": _tree(5)}, _FORGED + "a node is 5"),
    "tree_unknown_kind": ({"functd": _tree(_node(t="x"))}, _FORGED + "a node is {'t': 'x'}"),
    "batch_a_str": (
        {"functd": _tree(_node(t="td", batch="ab", items=[]))},
        _FORGED + "a TensorDict's batch size is 'ab'",
    ),
    "batch_of_floats": (
        {"functd": _tree(_node(t="td", batch=[1.5], items=[]))},
        _FORGED + r"it is not a valid TensorDict \(batch_size must be a sequence of non-neg",
    ),
    "batch_negative": (
        {"functd": _tree(_node(t="td", batch=[-1], items=[]))},
        _FORGED + r"it is not a valid TensorDict \(batch_size must be a sequence of non-neg",
    ),
    "batch_past_int64": (
        {"functd": _tree(_node(t="td", batch=[1 << 70], items=[]))},
        _FORGED
        + r"it is not a valid TensorDict \(batch_size \[1180591620717411303424\] has .*2\*\*63",
    ),
    "batch_numel_past_int64": (
        {"functd": _tree(_node(t="td", batch=[HUGE, HUGE], items=[]))},
        _FORGED + r"it is not a valid TensorDict .*more than torch can index",
    ),
    "batch_of_1000_dims": (
        {"functd": _tree(_node(t="td", batch=[1] * 1000, items=[]))},
        _FORGED + r"a TensorDict's batch size is \[1, 1, ",
    ),
    "batch_not_the_leaves": (
        {"functd": _tree(_node(t="td", batch=[3], items=[["w", _W]]))},
        _FORGED + r"it is not a valid TensorDict \(TensorDict entry 'w' has shape \[2\]",
    ),
    "items_an_int": (
        {"functd": _tree(_node(t="td", batch=[], items=5))},
        _FORGED + "the items are 5, not a list",
    ),
    "item_of_three": (
        {"functd": _tree(_node(t="dict", items=[[1, 2, 3]]))},
        _FORGED + r"an item is \[1, 2, 3\], not a \[str key, node\] pair",
    ),
    "item_key_a_list": (
        {"functd": _tree(_node(t="dict", items=[[["a"], _W]]))},
        _FORGED + r"an item is \[\['a'\], ",
    ),
    "list_items_a_dict": (
        {"functd": _tree(_node(t="list", items={"a": 1}))},
        _FORGED + r"a list's items are \{'a': 1\}, not a list",
    ),
    "tensor_name_a_list": (
        {"functd": _tree(_node(t="tensor", name=["w"]))},
        _FORGED + r"a tensor node names \['w'\], not a str",
    ),
    "tensor_missing": (
        {"functd": _tree(_node(t="tensor", name="zz"))},
        r"the file's tree names the tensor 'zz', which it lacks",
    ),
    "value_a_dict": (
        {"functd": _tree(_node(t="value", value={"a": [1]}))},
        _FORGED + r"a value node holds \{'a': \[1\]\}",
    ),
    "value_5000_digits": (
        {"functd": '{"version":1,"tree":{"t":"value","value":' + "9" * 5000 + "}}"},
        r"not one this version reads \(Exceeds the limit",
    ),
}


def forged_safetensors(folder: str | os.PathLike) -> list[tuple[str, Path, str]]:
    """Write every case of ``CASES`` (a file holding ``w = zeros(2)``) and one whose
    tensor name nests 3000 levels (no functd metadata); returns ``[(name, path, regex)]``."""
    import safetensors.torch as st

    folder = Path(folder)
    out = []
    for name, (meta, says) in CASES.items():
        path = folder / f"{name}.safetensors"
        st.save_file({"w": torch.zeros(2)}, str(path), metadata={"format": "pt", **meta})
        out.append((name, path, says))
    path = folder / "name_of_3000_parts.safetensors"
    st.save_file({"a." * 3000 + "a": torch.zeros(2)}, str(path), metadata={"format": "pt"})
    out.append(("name_of_3000_parts", path, r"has more than 100 dotted parts"))
    return out


class _Reduce:
    """Pickles as ``fn(*args)`` (what a forger writes into an archive's pickle)."""

    def __init__(self, fn: Any, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return (self.fn, self.args)


def huge_batch_pt(path: str | os.PathLike, batch: list[int]) -> None:
    """An archive whose pickle builds ``TensorDict({}, batch)`` (and one holding it)."""
    torch.save({"td": _Reduce(fd.TensorDict, ({}, batch))}, path)


def huge_batch_safetensors(path: str | os.PathLike, batch: list[int]) -> None:
    import safetensors.torch as st

    tree = _node(t="dict", items=[["td", _node(t="td", batch=batch, items=[])]])
    st.save_file({}, str(path), metadata={"format": "pt", "functd": _tree(tree)})


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def peak_kb() -> int:
    """The peak RSS since the last ``reset_peak`` (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# ----------------------------------------------------------------- full disk
def _small_fit(path: str, limit_at: int) -> Any:
    """A 3-epoch ``fd.fit`` checkpointing to ``path``; from epoch ``limit_at`` on, the
    process's file size limit is half the checkpoint's size (set when that epoch's
    batches are asked)."""
    import resource

    model = fd.Module(fd.nn.MLP(3, 1, num_cells=(64,)), in_keys=["x"], out_keys=["pred"])
    params = model.init(fd.random.key(0))

    def loss_fn(params, batch, key):
        return ((model(params, x=batch["x"]) - batch["y"]) ** 2).mean()

    def batches(epoch):
        if epoch == limit_at:
            half = os.path.getsize(path) // 2
            resource.setrlimit(resource.RLIMIT_FSIZE, (half, resource.RLIM_INFINITY))
        x = fd.random.normal(fd.random.fold_in(fd.random.key(9), epoch), (4, 3))
        return [fd.TensorDict({"x": x, "y": x.sum(-1, keepdim=True)}, [4])]

    opt = fd.optim.adam(1e-2)
    step = fd.train_step(loss_fn, opt)
    return fd.fit(step, params, opt.init(params), batches, fd.random.key(1), epochs=3,
                  checkpoint=path, progress=False)  # fmt: skip


def fsize_child(folder: str) -> dict:
    """Under a 64 KiB file size limit (SIGXFSZ ignored, so a write fails with EFBIG):
    ``fd.save`` of 400 KB to ``.pt`` and ``.safetensors`` paths holding a small file, and
    a ``fit`` whose third epoch's checkpoint meets the limit. Per case: the error, the
    value then at the path, the folder's files."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    small = fd.TensorDict({"x": torch.ones(10)}, [10])
    big = fd.TensorDict({"x": torch.zeros(100_000)}, [100_000])
    out: dict[str, Any] = {}
    for ext in (".pt", ".safetensors"):
        path = os.path.join(folder, "c" + ext)
        fd.save(small, path)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
        try:
            fd.save(big, path)
            err = None
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)
        out[ext] = {"error": err, "rows": fd.load(path).batch_size[0]}
    ckpt = os.path.join(folder, "fit", "ckpt.pt")
    os.makedirs(os.path.dirname(ckpt))
    try:
        _small_fit(ckpt, limit_at=2)
        err = None
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)
    out["fit"] = {"error": err, "epoch": int(fd.load(ckpt)["epoch"])}
    out["files"] = sorted(os.listdir(folder)) + sorted(os.listdir(os.path.dirname(ckpt)))
    return out


# ----------------------------------------------------------------- killed writers
def _checkpoint_forever(path: str, mb: int) -> None:
    from functd._checkpoint import Checkpoints

    ckpt = Checkpoints("fd.fit", path, keep=2)
    state = {"x": torch.randn(mb << 18)}  # mb MB of float32
    while True:
        ckpt.write(state)


def kill_checkpoints(folder: str, kills: int, mb: int, seed: int = 0, span: float = 3) -> dict:
    """SIGKILL a process checkpointing ``mb`` MB in a loop (``Checkpoints.write``, as
    ``fit`` does), ``kills`` times at random moments of about the first ``span`` writes.
    After each kill: how many of functd's temporary files are in the folder, and their
    bytes (``span=1``: most kills land inside a first write, as when a job is killed
    again and again before its first checkpoint of a resumed run is written)."""
    import multiprocessing
    import random
    import signal
    import time

    rng = random.Random(seed)
    path = os.path.join(folder, "ckpt.pt")
    ctx = multiprocessing.get_context("fork")
    counts, sizes, per_write = [], [], 0.03 * mb / 4 + 0.02
    for _ in range(kills):
        p = ctx.Process(target=_checkpoint_forever, args=(path, mb))
        p.start()
        time.sleep(rng.uniform(0.02, span * per_write))
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        temps = [n for n in os.listdir(folder) if n.endswith(".tmp") and ".fdsave-" in n]
        counts.append(len(temps))
        sizes.append(sum(os.path.getsize(os.path.join(folder, n)) for n in temps))
    whole = True
    try:
        fd.load(path)
    except Exception:
        whole = False
    return {"kills": kills, "temps_after_each_kill": counts, "most_bytes": max(sizes),
            "inside_a_write": sum(c > 0 for c in counts), "newest_loads": whole}  # fmt: skip


if __name__ == "__main__":
    import argparse

    a = argparse.ArgumentParser(description="the file size limit child, or the kill loop")
    a.add_argument("folder")
    a.add_argument("--kills", type=int, default=0)
    a.add_argument("--mb", type=int, default=4)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--span", type=float, default=3.0)
    args = a.parse_args()
    if args.kills:
        print(json.dumps(kill_checkpoints(args.folder, args.kills, args.mb, args.seed, args.span)))
    else:
        print(json.dumps(fsize_child(args.folder)))

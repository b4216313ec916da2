"""One rank of the 2-process gloo job of tests/test_distributed.py.

Run as ``python tests/_support/dist_worker.py RANK WORLD PORT OUT_DIR`` (the test
starts both ranks). Every check runs on both ranks in the same order (the
collectives pair up); its outcome, ``"ok"`` or the error's type and message,
goes to ``OUT_DIR/rank{RANK}.json``. A check that fails raises on its rank and
the job goes on with the next one.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import itertools
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import functd as fd
from tests._support.dist_job import run_checks

torch.set_default_dtype(torch.float64)
RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
TOL = dict(rtol=0, atol=1e-12)
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def close(a, b, tol=TOL):
    fd.testing.assert_close(a, b, **tol)


def tree_for(r: int, cap_leaves: bool = True) -> dict:
    """Rank ``r``'s input: nested TensorDict, plain dict entries, 3 dtypes."""
    g = torch.Generator().manual_seed(100 + r)
    td = fd.TensorDict(
        {
            "w": torch.randn(4, 6, generator=g),
            "inner": {"b": torch.randn(4, generator=g), "s": torch.randn(4, 2, generator=g)},
        },
        [4],
    )
    return {
        "td": td,
        "f32": torch.randn(6, 3, generator=g).float(),
        "i64": torch.randint(-5, 5, (2, 3), generator=g),
    }


def snapshot(tree):
    return fd.tree.map(lambda x: x.clone(), tree)


def same_ptrs(a, b) -> bool:
    pa = {x.untyped_storage().data_ptr() for x in fd.tree.leaves(a)}
    return any(x.untyped_storage().data_ptr() in pa for x in fd.tree.leaves(b))


# ------------------------------------------------------------------ collectives
@check
def all_reduce_ops():
    mine = tree_for(RANK)
    before = snapshot(mine)
    everyone = [tree_for(r) for r in range(WORLD)]
    refs = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}
    for op, ref in refs.items():
        want = fd.tree.map(lambda *xs, ref=ref: ref(torch.stack(xs), 0), *everyone)
        for cap in (25, 1e-4):  # one bucket per dtype; one bucket per leaf
            got = fd.distributed.all_reduce(mine, op=op, bucket_cap_mb=cap)
            close(got, want)
            assert not same_ptrs(got, mine)
    floats = {"td": mine["td"], "f32": mine["f32"]}
    got = fd.distributed.all_reduce(floats, op="mean")
    want = fd.tree.map(
        lambda *xs: sum(xs) / WORLD, *[{"td": e["td"], "f32": e["f32"]} for e in everyone]
    )
    close(got, want)
    assert type(got["td"]) is fd.TensorDict and got["td"].batch_size == torch.Size([4])
    close(mine, before, dict(rtol=0, atol=0))  # purity


@check
def broadcast_all_gather_reduce_scatter():
    mine = tree_for(RANK)
    before = snapshot(mine)
    everyone = [tree_for(r) for r in range(WORLD)]
    got = fd.distributed.broadcast(mine, src=1)
    close(got, everyone[1], dict(rtol=0, atol=0))
    assert not same_ptrs(got, mine)
    gathered = fd.distributed.all_gather(mine, bucket_cap_mb=1e-4)
    close(gathered, fd.tree.map(lambda *xs: torch.stack(xs), *everyone), dict(rtol=0, atol=0))
    assert gathered["td"].batch_size == torch.Size([WORLD, 4])
    rs = fd.distributed.reduce_scatter(mine, op="sum")
    n = 4 // WORLD
    full = fd.tree.map(lambda *xs: torch.stack(xs).sum(0), *everyone)
    want = fd.tree.map(
        lambda x: x[RANK * x.shape[0] // WORLD : (RANK + 1) * x.shape[0] // WORLD], full
    )
    close(rs, want)
    assert rs["td"].batch_size == torch.Size([n])
    floats = {"td": mine["td"], "f32": mine["f32"]}
    for op, ref in [("mean", lambda s: s.mean(0)), ("max", lambda s: s.amax(0))]:
        got = fd.distributed.reduce_scatter(floats, op=op, bucket_cap_mb=1e-4)
        full = fd.tree.map(
            lambda *xs, ref=ref: ref(torch.stack(xs)),
            *[{"td": e["td"], "f32": e["f32"]} for e in everyone],
        )
        close(
            got, fd.tree.map(lambda x: x[RANK * x.shape[0] // WORLD :][: x.shape[0] // WORLD], full)
        )
    close(mine, before, dict(rtol=0, atol=0))


@check
def laws_on_random_trees():
    """On 12 seeded random trees (the same seeds on every rank): all_gather of
    reduce_scatter is all_reduce (the split rule), broadcast from r is all_gather's
    entry r, and the bucket cap does not change any result."""
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)  # the layout: the same on every rank
        n = 2 * int(torch.randint(1, 4, (1,), generator=g))
        shapes = [
            (
                n,
                *torch.randint(
                    1, 4, (int(torch.randint(0, 3, (1,), generator=g)),), generator=g
                ).tolist(),
            )
            for _ in range(int(torch.randint(1, 5, (1,), generator=g)))
        ]
        dtypes = [
            (torch.float32, torch.float64)[int(torch.randint(0, 2, (1,), generator=g))]
            for _ in shapes
        ]
        cap = float(torch.rand((), generator=g)) * 1e-4
        v = torch.Generator().manual_seed(1000 * seed + RANK)  # the values: per rank
        t = {
            f"k{i}": torch.randn(s, generator=v, dtype=d)
            for i, (s, d) in enumerate(zip(shapes, dtypes))
        }
        td = fd.TensorDict(t, [n])
        for op in ("sum", "max"):
            full = fd.distributed.all_reduce(td, op=op)
            close(fd.distributed.all_reduce(td, op=op, bucket_cap_mb=cap), full)
            parts = fd.distributed.all_gather(
                fd.distributed.reduce_scatter(td, op=op, bucket_cap_mb=cap)
            )
            close(fd.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), parts), full)
        every = fd.distributed.all_gather(td, bucket_cap_mb=cap)
        for src in range(WORLD):
            close(fd.distributed.broadcast(td, src=src), every[src], dict(rtol=0, atol=0))


# ------------------------------------------------------------------ data parallel vs DDP
def make_net(sizes=(8, 32, 32, 1), seed=0):
    torch.manual_seed(seed)
    layers = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def data(steps, n=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)) for _ in range(steps)]


def functd_loss(model):
    def loss_fn(params, batch, key):
        return ((model(params, x=batch["x"]) - batch["y"]) ** 2).mean()

    return loss_fn


def local(x):
    n = x.shape[0] // WORLD
    return x[RANK * n : (RANK + 1) * n]


@check
def pmean_adam_equals_ddp_and_single_process():
    net = make_net()
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    params0 = fd.from_module(net)
    batches = data(10)
    # functd, 2 ranks
    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    step = fd.train_step(functd_loss(model), opt)
    p, s = params0, opt.init(params0)
    for x, y in batches:
        p, s, _ = step(
            p, s, fd.TensorDict({"x": local(x), "y": local(y)}, [x.shape[0] // WORLD]), None
        )
    # one process, the full batch
    single = fd.train_step(functd_loss(model), fd.optim.adam(1e-2))
    q, t = params0, fd.optim.adam(1e-2).init(params0)
    for x, y in batches:
        q, t, _ = single(q, t, fd.TensorDict({"x": x, "y": y}, [x.shape[0]]), None)
    # torch DDP + torch.optim.Adam
    ddp = nn.parallel.DistributedDataParallel(make_net())
    topt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    for x, y in batches:
        topt.zero_grad()
        ((ddp(local(x)) - local(y)) ** 2).mean().backward()
        topt.step()
    ref = fd.from_module(ddp.module)
    close(p, ref)
    close(p, q)
    close(params0, fd.from_module(make_net()), dict(rtol=0, atol=0))  # purity


@check
def clip_after_pmean_sees_global_norm():
    net = make_net()
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    params0 = fd.from_module(net)
    ((x, y),) = data(1)
    tail = (fd.optim.clip_by_global_norm(0.05), fd.optim.sgd(0.1))
    dp = fd.optim.chain(fd.distributed.mean_updates(), *tail)
    step = fd.train_step(functd_loss(model), dp)
    p, _, _ = step(
        params0, dp.init(params0), fd.TensorDict({"x": local(x), "y": local(y)}, [8]), None
    )
    sp = fd.optim.chain(*tail)
    q, _, _ = fd.train_step(functd_loss(model), sp)(
        params0, sp.init(params0), fd.TensorDict({"x": x, "y": y}, [16]), None
    )
    close(p, q)


@check
def fit_data_parallel_equals_single_process():
    net = make_net()
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    init = fd.from_module(net)
    # the ranks start from different params: fit broadcasts rank 0's
    params0 = init if RANK == 0 else fd.tree.map(torch.zeros_like, init)
    batches = [fd.TensorDict({"x": x, "y": y}, [16]) for x, y in data(3)]
    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-2))
    step = fd.train_step(functd_loss(model), opt)
    path = os.path.join(OUT, "ckpt.pt")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):  # tqdm: stderr
        p, _, hist = fd.fit(
            step,
            params0,
            opt.init(params0),
            batches,
            epochs=2,
            progress=True,
            data_parallel=True,
            checkpoint=path,
        )
    single = fd.train_step(functd_loss(model), fd.optim.adam(1e-2))
    q, _, h1 = fd.fit(
        single, init, fd.optim.adam(1e-2).init(init), batches, epochs=2, progress=False
    )
    close(p, q)
    close(hist["loss"], h1["loss"])
    printed = buf.getvalue()
    assert ("epoch 2/2" in printed) == (RANK == 0), printed  # rank 0 prints, alone
    saved = fd.load(path, map_location="cpu")
    close(saved["params"], q)
    assert int(saved["epoch"]) == 2


@check
def compiled_step_and_collectives_equal_eager():
    """One compiled function (one trace, fullgraph: no graph break): a train step
    with pmean, and the four collectives."""
    import torch._dynamo

    torch._dynamo.reset()
    net = make_net((8, 4, 1))
    model = fd.Module(net, in_keys=["x"], out_keys=["y"])
    params0 = fd.from_module(net)
    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.sgd(0.1))
    step = fd.train_step(functd_loss(model), opt)
    ((x, y),) = data(1)
    batch = fd.TensorDict({"x": local(x), "y": local(y)}, [8])
    t = tree_for(RANK)
    t = {"td": t["td"], "f32": t["f32"]}

    def f(params, state, batch, t):
        return step(params, state, batch, None)[0], (
            fd.distributed.broadcast(t, src=1),
            fd.distributed.all_gather(t),
            fd.distributed.reduce_scatter(t, op="sum"),
            fd.distributed.all_reduce(t, op="max"),
        )

    eager = f(params0, opt.init(params0), batch, t)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    close(compiled(params0, opt.init(params0), batch, t), eager)


@check
def pmean_resolves_partial_dtensor_grads():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    mesh = init_device_mesh("cpu", (WORLD,))
    g = torch.arange(6.0).reshape(2, 3) + 10 * RANK  # this rank's partial sum
    plain = torch.full((2,), float(RANK))
    grads = fd.TensorDict(
        {
            "partial": DTensor.from_local(g, mesh, [Partial()]),
            "replicated": DTensor.from_local(torch.ones(3), mesh, [Replicate()]),
            "plain": plain,
        },
        [],
    )
    tx = fd.distributed.mean_updates()
    out, _ = tx.update(grads, tx.init(fd.TensorDict({"w": torch.ones(1)}, [])))
    part = out["partial"]
    assert part.placements == (Replicate(),)
    # the sum over ranks (the gradient of the global loss), not divided again
    want = sum(torch.arange(6.0).reshape(2, 3) + 10 * r for r in range(WORLD))
    close(part.to_local(), want)
    assert out["replicated"] is grads["replicated"]
    close(out["plain"], torch.full((2,), sum(range(WORLD)) / WORLD))
    assert grads["partial"].placements == (Partial(),)  # purity
    # shard_batch slices plain tensors and keeps DTensors (they carry their sharding)
    from torch.distributed.tensor import Shard

    dx = DTensor.from_local(torch.ones(2, 3), mesh, [Shard(0)])
    local_rows = fd.distributed.shard_batch({"x": torch.arange(4.0), "d": dx})
    close(local_rows["x"], torch.arange(4.0)[2 * RANK : 2 * RANK + 2])
    assert local_rows["d"] is dx


@check
def pmean_hot_path_equals_all_reduce():
    """pmean/psum's cached eager path (repeated calls, layout changes, several
    buckets, a Parameter leaf on the general path) equals all_reduce, and is pure."""
    from functd.distributed import _fast

    def grads(r, n=4):
        g = torch.Generator().manual_seed(200 + r)
        return fd.TensorDict(
            {
                "l1": {"w": torch.randn(n, 3, generator=g), "b": torch.randn(n, generator=g)},
                "out": torch.randn(2, n, generator=g),
            },
            [],
        )

    for n in (4, 5, 4):  # a new layout, then a known one again
        mine, everyone = grads(RANK, n), [grads(r, n) for r in range(WORLD)]
        before = snapshot(mine)
        want = fd.tree.map(lambda *xs: sum(x / WORLD for x in xs), *everyone)
        for cap in (25, 1e-5):  # one flat buffer; one bucket a leaf
            pm = fd.distributed.mean_updates(bucket_cap_mb=cap)
            for _ in range(3):  # the first call makes the entry, the others hit it
                got, st = pm.update(mine, pm.init(mine))
                close(got, want, dict(rtol=0, atol=0))  # bit-equal: divided before the sum
                assert not same_ptrs(got, mine) and list(st.keys()) == []
        close(mine, before, dict(rtol=0, atol=0))  # purity
    ps = fd.distributed.sum_updates()
    ints = fd.TensorDict({"a": torch.arange(3) + RANK, "b": torch.ones(2, dtype=torch.int32)}, [])
    for _ in range(2):
        got, _ = ps.update(ints, ps.init(fd.TensorDict({"a": torch.ones(3)}, [])))
        assert got["a"].tolist() == [1, 3, 5] and got["b"].tolist() == [2, 2]
    param = fd.TensorDict({"w": nn.Parameter(torch.full((2,), float(RANK)))}, [])
    got, _ = fd.distributed.mean_updates().update(param, fd.TensorDict({}, []))
    assert got["w"].tolist() == [0.5, 0.5]
    assert _fast._entries  # the hot path was taken
    # a mismatch on a new layout is still caught on every rank, naming the key
    bad = fd.TensorDict({"w": torch.ones(2, 7 + RANK)}, [])
    return expect(
        ValueError, lambda: fd.distributed.mean_updates().update(bad, fd.TensorDict({}, []))
    )


# ------------------------------------------------------------------ bad input
def expect(exc, fn):
    try:
        fn()
    except exc as e:
        return str(e)
    raise AssertionError(f"no {exc.__name__} raised")


@check
def bad_different_keys():
    t = {"a": torch.ones(3), ("b" if RANK == 0 else "c"): torch.ones(2)}
    return expect(ValueError, lambda: fd.distributed.all_reduce(t))


@check
def bad_different_shapes():
    t = fd.TensorDict({"a": torch.ones(3), "w": torch.ones(2, 3 + RANK)}, [])
    return expect(ValueError, lambda: fd.distributed.all_reduce(t, op="sum"))


@check
def bad_fit_batch_not_divisible():
    model = fd.Module(make_net((8, 1)), in_keys=["x"], out_keys=["y"])
    params = model.init(fd.random.key(0))
    opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.sgd(0.1))
    step = fd.train_step(functd_loss(model), opt)
    batches = [fd.TensorDict({"x": torch.ones(5, 8), "y": torch.ones(5, 1)}, [5])]
    return expect(
        ValueError,
        lambda: fd.fit(step, params, opt.init(params), batches, data_parallel=True, progress=False),
    )


@check
def bad_fit_without_pmean():
    model = fd.Module(make_net((8, 1)), in_keys=["x"], out_keys=["y"])
    params = model.init(fd.random.key(0))
    step = fd.train_step(functd_loss(model), fd.optim.sgd(0.1))
    state = fd.optim.sgd(0.1).init(params)
    return expect(ValueError, lambda: fd.fit(step, params, state, [], data_parallel=True))


@check
def bad_arguments():
    odd = fd.TensorDict({"w": torch.ones(3, 2)}, [3])
    return [
        expect(ValueError, lambda: fd.distributed.reduce_scatter(odd)),
        expect(ValueError, lambda: fd.distributed.all_reduce(odd, op="avg")),
        expect(
            TypeError, lambda: fd.distributed.all_reduce({"n": torch.ones(2, dtype=torch.int64)})
        ),
        expect(TypeError, lambda: fd.distributed.all_reduce({"n": 3.0})),
        expect(ValueError, lambda: fd.distributed.broadcast(odd, src=WORLD)),
        expect(TypeError, lambda: torch.func.vmap(fd.distributed.all_reduce)(odd)),
    ]


def main() -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{PORT}",
        rank=RANK,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    run_checks(CHECKS, RANK, OUT)


if __name__ == "__main__":
    main()

"""One rank of the 2-process job of tests/test_distributed_sharding.py.

Run as ``python tests/_support/dist_sharding_worker.py RANK WORLD PORT OUT_DIR``: joins a
gloo group on 127.0.0.1, runs every check, and writes ``OUT_DIR/rank{RANK}.json``:
``{check: {"value": float | str, ...}}``. The test asserts on the values; a check
that raised records ``{"error": "..."}``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard

import functd as fd

D = torch.float64
RESULTS: dict = {}


def check(fn):
    try:
        RESULTS[fn.__name__] = fn()
    except Exception as e:  # recorded, asserted by the test
        RESULTS[fn.__name__] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    return fn


def maxdiff(a, b) -> float:
    fa = dict(a.items(True, True)) if isinstance(a, fd.TensorDict) else {"x": a}
    fb = dict(b.items(True, True)) if isinstance(b, fd.TensorDict) else {"x": b}
    assert set(fa) == set(fb), (sorted(map(str, fa)), sorted(map(str, fb)))
    return max(float((fa[k] - fb[k]).abs().max()) for k in fa)


def message(exc, fn) -> str:
    """The text of the ``exc`` that ``fn()`` raises, or "no error" (the tests then
    fail on the missing words)."""
    try:
        fn()
    except exc as e:
        return str(e)
    return "no error"


def mlp():
    return fd.Sequential(
        fd.Module(fd.nn.Linear(6, 8), ["x"], ["h"]),
        fd.Module(torch.tanh, ["h"], ["h"]),
        fd.Module(fd.nn.Linear(8, 4), ["h"], ["y"]),
    )


def data(n=10):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g, dtype=D), torch.randn(n, 4, generator=g, dtype=D)


RULES = {"*.weight": [Shard(0)], "*": [Replicate()]}


def main() -> None:
    # pyproject's filterwarnings: functd's warnings are errors, torch's deprecations not
    warnings.filterwarnings("error")
    for cat in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=cat, module=r"torch\..*")
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mesh = init_device_mesh("cpu", (world,))
    model = mlp()
    params = model.init(fd.random.key(0), dtype=D)
    x, t = data()

    def loss(p, x, t):
        y = model(p, fd.TensorDict({"x": x}, [x.shape[0]]))["y"]
        if fd.distributed.is_dtensor(y):  # a DTensor, also under fd.grad's wrapper
            t = fd.distributed.replicate(t, mesh)
        return ((y - t) ** 2).mean()

    @check
    def shard_placements():
        sp = fd.distributed.shard(params, mesh, RULES)
        return {
            "w": str(sp["0", "weight"].placements),
            "b": str(sp["0", "bias"].placements),
            "local_rows": sp["0", "weight"].to_local().shape[0],
            "roundtrip": maxdiff(fd.distributed.gather(sp), params),
            "input_unchanged": maxdiff(params, model.init(fd.random.key(0), dtype=D)),
        }

    @check
    def shard_no_rule():
        return {
            "msg": message(
                KeyError, lambda: fd.distributed.shard(params, mesh, {"*.weight": [Shard(0)]})
            )
        }

    @check
    def dtensor_forward_grad_update():
        sp = fd.distributed.shard(params, mesh, RULES)
        td = fd.TensorDict({"x": x}, [10])
        out_ref = model(params, td)["y"]
        out = model(sp, td)["y"]  # plain input next to DTensor params
        g_ref = fd.grad(loss)(params, x, t)
        g = fd.grad(loss)(sp, x, t)
        opt = fd.optim.adam(1e-2)
        p_ref, s_ref, p, s = params, opt.init(params), sp, opt.init(sp)
        for _ in range(3):
            u, s_ref = opt.update(fd.grad(loss)(p_ref, x, t), s_ref, p_ref)
            p_ref = fd.optim.apply_updates(p_ref, u)
            u, s = opt.update(fd.grad(loss)(p, x, t), s, p)
            p = fd.optim.apply_updates(p, u)
        return {
            "out_is_dtensor": isinstance(out, DTensor),
            "forward": maxdiff(out.full_tensor(), out_ref),
            "grad_is_dtensor": isinstance(g["0", "weight"], DTensor),
            "grad_placement": str(g["0", "weight"].placements),
            "grad": maxdiff(fd.distributed.gather(g), g_ref),
            "update": maxdiff(fd.distributed.gather(p), p_ref),
        }

    @check
    def dtensor_params_under_vmap():
        """fd.vmap of a module call (per-example, and an ensemble with a member dim)
        and fd.grad through it, on Replicate / Shard(0) params, against plain params."""

        def call(p, xi):
            return model(p, fd.TensorDict({"x": xi}, xi.shape[:-1]))["y"]

        def full(y):
            return y.full_tensor() if isinstance(y, DTensor) else y

        def dloss(p, xi, ti):
            return ((call(p, xi) - ti) ** 2).mean()

        keys = fd.random.split(fd.random.key(3), 2)
        ens = fd.vmap(lambda k: model.init(k, dtype=D))(keys)
        rows, trows = x[:, None, :], t[:, None, :]  # each example a [1, 6] matrix
        per_ex, ens_ex = (None, 0, 0), (0, None, None)
        out = {}
        for name, rules in (("replicate", {"*": [Replicate()]}), ("shard0", RULES)):
            sp, se = (
                fd.distributed.shard(params, mesh, rules),
                fd.distributed.shard(ens, mesh, rules),
            )
            xr, tr = fd.distributed.replicate(rows, mesh), fd.distributed.replicate(trows, mesh)
            xv, tv = fd.distributed.replicate(x, mesh), fd.distributed.replicate(t, mesh)
            y = fd.vmap(call, in_dims=(None, 0))(sp, xr)
            out[name] = {
                "forward": maxdiff(full(y), fd.vmap(call, in_dims=(None, 0))(params, rows)),
                "out_placements": str(y.placements),
                "vmap_grad": maxdiff(
                    fd.distributed.gather(fd.vmap(fd.grad(dloss), in_dims=per_ex)(sp, xr, tr)),
                    fd.vmap(fd.grad(dloss), in_dims=per_ex)(params, rows, trows),
                ),
                "grad_vmap": maxdiff(
                    fd.distributed.gather(
                        fd.grad(
                            lambda p, a=xr, b=tr: fd.vmap(dloss, in_dims=per_ex)(p, a, b).mean()
                        )(sp)
                    ),
                    fd.grad(lambda p: fd.vmap(dloss, in_dims=per_ex)(p, rows, trows).mean())(
                        params
                    ),
                ),
                "ensemble": maxdiff(
                    full(fd.vmap(call, in_dims=(0, None))(se, xv)),
                    fd.vmap(call, in_dims=(0, None))(ens, x),
                ),
                "ensemble_grad": maxdiff(
                    fd.distributed.gather(fd.vmap(fd.grad(dloss), in_dims=ens_ex)(se, xv, tv)),
                    fd.vmap(fd.grad(dloss), in_dims=ens_ex)(ens, x, t),
                ),
                # per-example 1-D vectors: F.linear's matmul squeezes in place (below)
                "vector_shape": list(fd.vmap(call, in_dims=(None, 0))(sp, xv).shape),
            }
            if True:  # both placements (fd.nn.Linear works around the Replicate squeeze_)
                yv = fd.vmap(call, in_dims=(None, 0))(sp, xv)
                out[name]["vector_forward"] = maxdiff(
                    full(yv), fd.vmap(call, in_dims=(None, 0))(params, x)
                )
                out[name]["vector_grad"] = maxdiff(
                    fd.distributed.gather(fd.vmap(fd.grad(dloss), in_dims=per_ex)(sp, xv, tv)),
                    fd.vmap(fd.grad(dloss), in_dims=per_ex)(params, x, t),
                )
        # the torch limitation: DTensor's in-place squeeze_ keeps the size-1 dim
        r3 = fd.distributed.replicate(torch.ones(2, 1, 3, dtype=D), mesh)
        out["squeeze_inplace_shape"] = list(r3.clone().squeeze_(1).shape)
        # a plain input mapped by the vmap cannot be replicated inside it
        sp = fd.distributed.shard(params, mesh, RULES)
        out["plain_input"] = message(TypeError, lambda: fd.vmap(call, in_dims=(None, 0))(sp, x))
        return out

    @check
    def dtensor_train_step():
        sp = fd.distributed.shard(params, mesh, RULES)
        step = fd.train_step(lambda p, b, k: loss(p, b["x"], b["t"]), fd.optim.sgd(0.1))
        batch = fd.TensorDict({"x": x, "t": t}, [10])
        opt = fd.optim.sgd(0.1)
        p_ref, _, m_ref = step(params, opt.init(params), batch, None)
        p, _, m = step(sp, opt.init(sp), batch, None)
        return {
            "params": maxdiff(fd.distributed.gather(p), p_ref),
            "loss": abs(float(m["loss"].full_tensor()) - float(m_ref["loss"])),
        }

    @check
    def multi_input_module():  # Module._step: two in_keys next to DTensor params
        bil = fd.Module(fd.nn.Bilinear(6, 4, 4), ["x", "t"], ["y"])
        bp = bil.init(fd.random.key(3), dtype=D)
        sp = fd.distributed.shard(bp, mesh, {"weight": [Shard(0)], "*": [Replicate()]})
        td = fd.TensorDict({"x": x, "t": t}, [10])
        return {"forward": maxdiff(bil(sp, td)["y"].full_tensor(), bil(bp, td)["y"])}

    @check
    def mixed_meshes():
        other = init_device_mesh("cpu", (world,), mesh_dim_names=("other",))
        sp = fd.distributed.shard(params, mesh, RULES)
        bad = sp.set(("0", "bias"), fd.distributed.shard(params["0"], other, RULES)["bias"])
        xin = fd.distributed.replicate(x, other)
        return {
            "params": message(ValueError, lambda: model(bad, fd.TensorDict({"x": x}, [10]))),
            "input": message(ValueError, lambda: model(sp, fd.TensorDict({"x": xin}, [10]))),
        }

    @check
    def fsdp2_module():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).to(D)
        ref = copy.deepcopy(net)
        for m in net:
            if isinstance(m, nn.Linear):
                fully_shard(m)
        fully_shard(net)
        m = fd.Module(net, ["x"], ["y"])
        p = fd.from_module(m)
        p2 = fd.from_module(net)
        y = m(p, fd.TensorDict({"x": x}, [10]))["y"]
        tt = fd.distributed.replicate(t, p["0", "weight"].device_mesh)
        g = fd.grad(lambda p: ((m(p, x=x) - tt) ** 2).mean())(p)
        yr = ref(x)
        ((yr - t) ** 2).mean().backward()
        gref = fd.TensorDict(
            {
                "0": {"weight": ref[0].weight.grad, "bias": ref[0].bias.grad},
                "2": {"weight": ref[2].weight.grad, "bias": ref[2].bias.grad},
            },
            [],
        )
        # 3 Adam steps: fd.optim.adam on the FSDP2 shards == torch.optim.Adam unsharded
        opt, topt = fd.optim.adam(1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
        q, s = p, opt.init(p)
        for _ in range(3):
            u, s = opt.update(fd.grad(lambda p: ((m(p, x=x) - tt) ** 2).mean())(q), s, q)
            q = fd.optim.apply_updates(q, u)
            topt.zero_grad()
            ((ref(x) - t) ** 2).mean().backward()
            topt.step()
        return {
            "update": maxdiff(fd.distributed.gather(q), fd.from_module(ref)),
            "lowered": type(m.fn).__name__,
            "param_type": type(p["0", "weight"]).__name__,
            "same_keys": sorted(map(str, p.keys(True, True)))
            == sorted(map(str, p2.keys(True, True))),
            "forward": maxdiff(y.full_tensor(), yr.detach()),
            "grad": maxdiff(fd.distributed.gather(g), gref),
            "module_still_fsdp": type(net).__name__,
        }

    @check
    def fsdp2_functional_call():
        class Net(nn.Module):  # not lowered: runs through FunctionalCall's meta copy
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(6, 4)

            def forward(self, x):
                return torch.sin(self.a(x))

        torch.manual_seed(0)
        net = Net().to(D)
        ref = copy.deepcopy(net)
        fully_shard(net.a)
        fully_shard(net)
        m = fd.Module(net, ["x"], ["y"])
        y = m(fd.from_module(net), x=x)
        return {
            "layer": type(m.fn).__name__,
            "forward": maxdiff(y.full_tensor(), ref(x).detach()),
        }

    @check
    def ensemble_across_ranks():
        M, steps = 4, 3
        block = mlp()
        keys = fd.random.split(fd.random.key(7), M)
        opt = fd.optim.adam(1e-2)

        def member_loss(p, k):
            xk = fd.random.normal(k, (5, 6), dtype=D)
            y = block(p, fd.TensorDict({"x": xk}, [5]))["y"]
            return (y**2).mean()

        def train(p, ks):
            s = fd.vmap(opt.init)(p)
            losses = []
            for i in range(steps):
                kk = fd.vmap(lambda k, i=i: fd.random.fold_in(k, i))(ks)
                ls = fd.vmap(member_loss)(p, kk)
                g = fd.vmap(fd.grad(member_loss))(p, kk)
                u, s = fd.vmap(opt.update)(g, s, p)
                p = fd.optim.apply_updates(p, u)
                losses.append(ls)
            return p, torch.stack(losses, 1)

        full_p, full_l = train(fd.vmap(lambda k: block.init(k, dtype=D))(keys), keys)
        sl = fd.distributed.member_slice(M)
        local_init = fd.vmap(lambda k: block.init(k, dtype=D))(keys[sl])
        init_sliced = fd.distributed.shard_members(fd.vmap(lambda k: block.init(k, dtype=D))(keys))
        loc_p, loc_l = train(local_init, keys[sl])
        gathered = fd.distributed.gather_members(loc_p)
        with fd.distributed.axis("ranks"):
            mean_loss = fd.pmean(loc_l[:, -1].mean(), "ranks")
        return {
            "slice": [sl.start, sl.stop],
            "init_same": maxdiff(local_init, init_sliced),
            "local_members": loc_p.batch_size[0],
            "params": maxdiff(gathered, full_p),
            "losses": maxdiff(fd.distributed.gather_members(loc_l), full_l),
            "metric": abs(float(mean_loss) - float(full_l[:, -1].mean())),
        }

    @check
    def psum_ranks():
        xs = torch.arange(world * 3, dtype=D).reshape(world, 3) ** 2 + 1
        w = torch.linspace(-1, 1, world * 3, dtype=D).reshape(world, 3)

        def f(x, w):  # one loss, vmapped or over ranks
            return (fd.psum(x * x, "ranks") * w).sum() + fd.pmean(x, "ranks").sum()

        with fd.distributed.axis("ranks"):
            xr = xs[rank].clone()
            v = f(xr, w[rank])
            y = fd.psum(xr, "ranks")
            g = fd.grad(f)(xr, w[rank])
            xb = xr.clone().requires_grad_()
            f(xb, w[rank]).backward()
            _, jvp = torch.func.jvp(lambda v: fd.psum(v * v, "ranks"), (xr,), (w[rank],))
        members = xs[rank] * torch.arange(1.0, 4.0, dtype=D)[:, None]  # 3 members here
        with fd.distributed.axis("ranks"):
            in_vmap = fd.vmap(lambda v: fd.psum(v, "ranks"), axis_name="members")(members)
        ar_members = members.clone()
        dist.all_reduce(ar_members)
        ar = xr.clone()
        dist.all_reduce(ar)
        v_ref = fd.vmap(f, axis_name="ranks")(xs, w)[rank]
        g_ref = fd.vmap(fd.grad(f), axis_name="ranks")(xs, w)[rank]
        return {
            "value": abs(float(v - v_ref)),
            "psum_vs_all_reduce": maxdiff(y, ar),
            "inside_vmap": maxdiff(in_vmap, ar_members),
            "jvp": maxdiff(jvp, (2 * xs * w).sum(0)),
            "grad": maxdiff(g, g_ref),
            "backward": maxdiff(xb.grad, g_ref),
            "input_unchanged": maxdiff(xr, xs[rank]),
        }

    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(RESULTS, fh)
    # Skip the interpreter's teardown: freeing DDP/gloo objects after the group is
    # destroyed hung now and then (seen in benchmarks/data_parallel.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

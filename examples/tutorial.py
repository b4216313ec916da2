"""A tour of functd.TensorDict (the module walk-through comes with fd.Module).

Run with `make demo`.
"""

import torch

import functd as fd


def main() -> None:
    td = fd.TensorDict(
        {"x": torch.randn(5, 3), "obs": {"pos": torch.randn(5, 2)}}, batch_size=[5]
    )
    print("a TensorDict:           ", td)
    td2 = td.set("y", torch.zeros(5, 1))
    print("td.set('y', ...):       ", td2)
    print("td is unchanged:        ", td)
    print("nested get:             ", td2["obs", "pos"].shape)
    print("select / exclude:       ", td2.select("y"), td2.exclude("x"))
    print("batch indexing td[1:3]: ", td2[1:3])
    print("stack:                  ", fd.stack([td, td]))
    leaves, spec = fd.tree.flatten(td)
    print("a pytree:               ", [tuple(v.shape) for v in leaves])
    batched = torch.func.vmap(lambda t: t.set("norm", t["x"].norm()))(td)
    print("under torch.func.vmap:  ", batched)


if __name__ == "__main__":
    main()

"""functd.distributed: pure, tree-shaped collectives on top of torch.distributed.

torch.distributed is the engine (gloo on CPU, NCCL on GPU, launched by
``torchrun``); functd adds pure functions over trees: collectives that return
new trees, and data parallelism as an optimizer step. See notes/distributed.md.

Example:
    >>> import torch.distributed as dist, functd as fd
    >>> dist.init_process_group("gloo")                 # under torchrun
    >>> opt = fd.optim.chain(fd.distributed.pmean(), fd.optim.adam(1e-3))
    >>> step = fd.train_step(loss_fn, opt)              # each rank: its shard
    >>> mean = fd.distributed.all_reduce(metrics, op="mean")
"""

# --- collectives and data parallelism (notes/distributed.md, "Collectives" and
# "Data-parallel training")
from ._collectives import all_gather as all_gather
from ._collectives import all_reduce as all_reduce
from ._collectives import broadcast as broadcast
from ._collectives import reduce_scatter as reduce_scatter
from ._data_parallel import pmean as pmean
from ._data_parallel import psum as psum
from ._data_parallel import resolve_partial as resolve_partial
from ._fit import shard_batch as shard_batch

# --- end of collectives and data parallelism

__all__: list[str] = [
    # collectives and data parallelism
    "all_gather",
    "all_reduce",
    "broadcast",
    "pmean",
    "psum",
    "reduce_scatter",
    "resolve_partial",
    "shard_batch",
]

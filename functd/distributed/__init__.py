"""functd.distributed: pure, tree-shaped collectives on top of torch.distributed.

torch.distributed is the engine (gloo on CPU, NCCL on GPU, launched by
``torchrun``); functd adds pure functions over trees: collectives that return
new trees, data parallelism as an optimizer step, params placed on a
DeviceMesh by path rules, named axes over ranks and ensembles split across
ranks, and sharded checkpoints (``save``/``load`` through
torch.distributed.checkpoint). See notes/distributed.md.

Example:
    >>> import torch.distributed as dist, functd as fd
    >>> dist.init_process_group("gloo")                 # under torchrun
    >>> opt = fd.optim.chain(fd.distributed.mean_updates(), fd.optim.adam(1e-3))
    >>> step = fd.train_step(loss_fn, opt)              # each rank: its shard
    >>> mean = fd.distributed.all_reduce(metrics, op="mean")
"""

# collectives and data parallelism
from .._td._dtensor import is_dtensor as is_dtensor
from .._transforms._axes import axis as axis
from ._collectives import all_gather as all_gather
from ._collectives import all_reduce as all_reduce
from ._collectives import broadcast as broadcast
from ._collectives import reduce_scatter as reduce_scatter
from ._data_parallel import mean_updates as mean_updates
from ._data_parallel import resolve_partial as resolve_partial
from ._data_parallel import sum_updates as sum_updates
from ._dcp import load as load
from ._dcp import save as save

# sharded params, named axes over ranks, ensembles across ranks
from ._ensemble import gather_members as gather_members
from ._ensemble import member_slice as member_slice
from ._ensemble import shard_members as shard_members
from ._faults import CollectiveError as CollectiveError
from ._fit import shard_batch as shard_batch
from ._sharding import gather as gather
from ._sharding import replicate as replicate
from ._sharding import shard as shard

__all__: list[str] = [
    "CollectiveError",
    "all_gather",
    "all_reduce",
    "axis",
    "broadcast",
    "gather",
    "gather_members",
    "is_dtensor",
    "load",
    "member_slice",
    "mean_updates",
    "sum_updates",
    "reduce_scatter",
    "replicate",
    "resolve_partial",
    "save",
    "shard",
    "shard_batch",
    "shard_members",
]

"""functd.distributed: pure, tree-shaped collectives on top of torch.distributed.

(Being built; see notes/distributed.md once it lands.)
"""

# --- sharded params, named axes over ranks, ensembles across ranks (branch distb) ---
from .._axes import axis as axis
from .._dtensor import is_dtensor as is_dtensor
from ._ensemble import gather_members as gather_members
from ._ensemble import member_slice as member_slice
from ._ensemble import shard_members as shard_members
from ._sharding import gather as gather
from ._sharding import replicate as replicate
from ._sharding import shard as shard

__all__: list[str] = [
    # distb
    "axis",
    "gather",
    "gather_members",
    "is_dtensor",
    "member_slice",
    "replicate",
    "shard",
    "shard_members",
]

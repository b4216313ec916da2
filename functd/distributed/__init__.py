"""functd.distributed: pure, tree-shaped collectives on top of torch.distributed.

(Being built; see notes/distributed.md once it lands.)
"""

__all__: list[str] = []

"""inductor's config, compile entry, custom passes and decompositions
(``torch._inductor``): what fd.jit compiles its traced graphs with.

``torch.compile`` is the public door to inductor, but fd.jit traces the graph itself
(``make_fx`` on fake tensors) and hands it to inductor directly, with its own passes.
Importing this module imports inductor's lowering (seconds on a cold process): import it inside
the function that needs it. Versions: behaves as used on torch 2.11 to 2.14 (issue 37's
runs); before 2.13 its C++ wrapper cannot compile a loop op on the CPU (fd.jit then
takes the Python wrapper: ``functd._torch.CPP_WRAPPER_LOOPS``).

>>> from functd._torch.inductor import config
>>> callable(config.patch)
True
"""

from __future__ import annotations

from typing import Any

# ``inductor_prims`` registers ``prims.inductor_force_stride_order`` (fd.jit's passes emit
# it) on import; ``lowering`` is read by inductor's decompositions (max pooling)
from torch._inductor import config, inductor_prims, lowering
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.decomposition import select_decomp_table

__all__ = [
    "CustomGraphPass",
    "compile_fx_inner",
    "config",
    "inductor_prims",
    "lowering",
    "select_decomp_table",
]


def compile_fx_inner(*args: Any, **kwargs: Any) -> Any:
    """``torch._inductor.compile_fx.compile_fx_inner``, imported on the first compile
    (it pulls in inductor's code generators: ``trace`` with ``backend="fx"`` needs none)."""
    from torch._inductor.compile_fx import compile_fx_inner as compile_inner

    return compile_inner(*args, **kwargs)


# - ``config``: inductor's options, set per compile with ``config.patch({...})``
#   (``cpp.min_chunk_size``, ``realize_opcount_threshold``, the post-grad passes);
# - ``compile_fx_inner(gm, fakes, cpp_wrapper=..., is_inference=True)``: compiles one
#   ATen-level graph (what torch.compile calls after AOTAutograd);
# - ``CustomGraphPass``: the base of a post-grad pass inductor accepts in its config
#   (and hashes into its cache key);
# - ``select_decomp_table()``: the decompositions inductor lowers with (fd.jit traces
#   with the same table);
# - the side-effect imports: ``inductor_prims`` registers
#   ``prims.inductor_force_stride_order`` (fd.jit's passes emit it), ``lowering`` is read
#   by inductor's decompositions.

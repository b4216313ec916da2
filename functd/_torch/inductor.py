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

import os
import platform
import sys
import warnings
from typing import Any

# ``inductor_prims`` registers ``prims.inductor_force_stride_order`` (fd.jit's passes emit
# it) on import; ``lowering`` is read by inductor's decompositions (max pooling)
from torch._inductor import config, inductor_prims, lowering
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

__all__ = [
    "CustomGraphPass",
    "compile_fx_inner",
    "config",
    "default_cache_dir",
    "inductor_prims",
    "lowering",
    "select_decomp_table",
    "vec_isa_checked_once",
]


def compile_fx_inner(*args: Any, **kwargs: Any) -> Any:
    """``torch._inductor.compile_fx.compile_fx_inner``, imported on the first compile
    (it pulls in inductor's code generators: ``trace`` with ``backend="fx"`` needs none)."""
    from torch._inductor.compile_fx import compile_fx_inner as compile_inner

    return compile_inner(*args, **kwargs)


def vec_isa_checked_once() -> None:
    """Inductor's choice of a vector ISA for its C++ kernels, at one probe compile.

    Inductor (``cpu_vec_isa.valid_vec_isa_list``) compiles and loads a probe program
    for *every* ISA the CPU lists (AVX-512 VNNI, AVX-512, AVX2 on an AVX-512 machine;
    ~2 CPU s each, including ATen's vector headers) and then uses one: the first, or
    the one ``ATEN_CPU_CAPABILITY`` / ``cpp.simdlen`` names. Here that one ISA is
    checked first, as inductor checks it; if it builds and loads, inductor's list is
    filled with the check off (``cpp.vec_isa_ok``) for the others, so its pick is
    the same one at a third of the probes. Anything unusual (not x86-64 Linux, the
    list already made, ``vec_isa_ok`` set by the user, the chosen ISA failing its
    probe) leaves inductor to check every ISA itself. Cheap after the first call.

    >>> vec_isa_checked_once()
    """
    from torch._inductor import cpu_vec_isa as isa

    if (
        isa.valid_vec_isa_list.cache_info().currsize
        or config.cpp.vec_isa_ok is not None
        or sys.platform != "linux"
        or platform.machine() != "x86_64"
    ):
        return
    flags = isa.x86_isa_checker()
    listed = [v for v in isa.supported_vec_isa_list if all(f in flags for f in str(v).split())]
    chosen = _chosen_isa(listed, os.getenv("ATEN_CPU_CAPABILITY"), config.cpp.simdlen)
    if chosen is None or not chosen:  # ``not``: inductor's own probe compile of that ISA
        return
    with config.patch({"cpp.vec_isa_ok": True}):
        isa.valid_vec_isa_list()


def _chosen_isa(listed: list[Any], capability: str | None, simdlen: int | None) -> Any:
    """The ISA ``pick_vec_isa`` returns when every ISA in ``listed`` passes its probe."""
    from torch._inductor import cpu_vec_isa as isa

    if not listed:
        return None
    if simdlen is not None:
        return next((v for v in listed if v.bit_width() == simdlen), None)
    with warnings.catch_warnings():  # an unknown capability: inductor warns itself
        warnings.simplefilter("ignore")
        chosen = isa.get_isa_from_cpu_capability(capability, listed, isa.invalid_vec_isa)
    return chosen if chosen in listed else None


# - ``config``: inductor's options, set per compile with ``config.patch({...})``
#   (``cpp.min_chunk_size``, ``realize_opcount_threshold``, the post-grad passes);
# - ``compile_fx_inner(gm, fakes, cpp_wrapper=..., is_inference=True)``: compiles one
#   ATen-level graph (what torch.compile calls after AOTAutograd);
# - ``default_cache_dir()``: inductor's cache directory when TORCHINDUCTOR_CACHE_DIR is
#   unset (``<tmp>/torchinductor_<user>``); fd.jit checks who can write it;
# - ``CustomGraphPass``: the base of a post-grad pass inductor accepts in its config
#   (and hashes into its cache key);
# - ``select_decomp_table()``: the decompositions inductor lowers with (fd.jit traces
#   with the same table);
# - the side-effect imports: ``inductor_prims`` registers
#   ``prims.inductor_force_stride_order`` (fd.jit's passes emit it), ``lowering`` is read
#   by inductor's decompositions;
# - ``vec_isa_checked_once()``: inductor's vector ISA picked at one probe compile
#   (``torch._inductor.cpu_vec_isa``), before fd.jit's first CPU compile.

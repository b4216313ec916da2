"""torch's private APIs in one room: every ``torch._*`` name functd uses is imported
here, in one module per area, and nowhere else (tests/test_layers.py refuses a
``torch._`` access outside this package, but for the ``torch._foreach_*`` ops that
torch.optim itself runs).

Each module names, for each private object, what functd uses it for and from which
torch version it behaves as used; notes/torch-private.md lists them with what would
replace each once torch makes it public. The version gates live here too:
``TORCH_VERSION`` and ``requires``.

- ``functd._torch.functorch``: torch.func's interpreter stack and wrapper tensors.
- ``functd._torch.ops``: C++ entry points (``torch._VF``'s fused RNNs, DDP's flatten,
  the dispatch-stack and autocast probes, ``OpOverload``).
- ``functd._torch.fake``: fake tensors and the tracing context (fd.jit's traces).
- ``functd._torch.hop``: the ``scan`` and ``while_loop`` higher-order ops (fd.scan,
  fd.while_loop under dynamo and fd.jit).
- ``functd._torch.dynamo``: dynamo's counters and tensor guards (imports
  ``torch._dynamo``: import it lazily).
- ``functd._torch.inductor``: inductor's config, compile entry, passes and
  decompositions (imports ``torch._inductor``: import it lazily).

This package imports torch only (it sits in the lowest layer: every room may import it).

>>> from functd._torch import TORCH_VERSION, requires
>>> TORCH_VERSION >= (2, 0)
True
>>> requires((2, 0), "fd.scan")  # silent on a torch that has it
"""

from __future__ import annotations

import re

import torch

__all__ = [
    "CPP_WRAPPER_LOOPS",
    "FOREACH_LERP_DTENSOR",
    "NEWEST_TESTED",
    "OLDEST",
    "TORCH_VERSION",
    "VIEW_DTYPE_BATCHES",
    "requires",
]


def _parse(version: str) -> tuple[int, int]:
    """``"2.13.0+cpu"`` -> ``(2, 13)``; a dev build ``"2.15.0a0+git..."`` -> ``(2, 15)``."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise RuntimeError(f"functd: cannot read torch's version {version!r} (torch.__version__)")
    return int(m.group(1)), int(m.group(2))


#: The installed torch as ``(major, minor)``: compare it with a tuple,
#: ``TORCH_VERSION >= (2, 13)``.
TORCH_VERSION: tuple[int, int] = _parse(str(torch.__version__))


def requires(version: tuple[int, int], feature: str) -> None:
    """Raise a clear error when the installed torch is older than ``version``, the first
    one that has ``feature`` (a name the user knows: ``"fd.jit of fd.scan"``).

    >>> requires((99, 0), "a feature")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    RuntimeError: a feature needs torch>=99.0; this is torch ...: upgrade torch...
    """
    if version > TORCH_VERSION:
        raise RuntimeError(
            f"{feature} needs torch>={version[0]}.{version[1]}; this is torch "
            f"{torch.__version__}: upgrade torch (pip install -U 'torch>="
            f"{version[0]}.{version[1]}')"
        )


# The version gates: what functd does differently on an older torch of the range.

#: inductor's C++ wrapper compiles a graph with a loop op (``scan``, ``while_loop``) on
#: the CPU from torch 2.13; 2.11 and 2.12 assert in its ``codegen_while_loop``, so fd.jit
#: compiles such a graph with inductor's Python wrapper there (``_jit_compile_options.uses_cpp_wrapper``:
#: a few µs more per call, the same kernels).
CPP_WRAPPER_LOOPS: bool = TORCH_VERSION >= (2, 13)

#: torch.func.vmap batches ``Tensor.view(dtype)`` (``aten::view.dtype``) from torch 2.13;
#: before, functd.random reads a key's or a draw's bits as another integer dtype by
#: conversions (``functd._threefry.bitcast``: the same bits, a copy).
VIEW_DTYPE_BATCHES: bool = TORCH_VERSION >= (2, 13)

#: DTensor has a sharding rule for ``torch._foreach_lerp`` (out of place) from torch 2.13;
#: before, functd.optim's moving averages of DTensors take ``torch.lerp`` leaf by leaf
#: (``optim._listops.ema``: the same values).
FOREACH_LERP_DTENSOR: bool = TORCH_VERSION >= (2, 13)

#: The oldest and newest torch releases (major, minor) the whole suite passes on; the
#: range pyproject.toml declares (``torch>=2.13,<2.15``; notes/torch-private.md).
OLDEST: tuple[int, int] = (2, 13)
NEWEST_TESTED: tuple[int, int] = (2, 14)

if TORCH_VERSION < OLDEST:  # before any other functd module meets an older torch's API
    raise ImportError(
        f"functd needs torch>={OLDEST[0]}.{OLDEST[1]} (tested on {OLDEST[0]}.{OLDEST[1]} to "
        f"{NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}); this Python has torch {torch.__version__}. "
        f"Upgrade torch: pip install 'torch>={OLDEST[0]}.{OLDEST[1]},<{NEWEST_TESTED[0]}."
        f"{NEWEST_TESTED[1] + 1}'"
    )

"""torch's higher-order loop ops (``torch._higher_order_ops``): the ``scan`` and
``while_loop`` operators that dynamo, ``make_fx`` and inductor understand as loops.

fd.scan and fd.while_loop run a Python loop in eager mode and one of these ops under
dynamo or an fd.jit trace, so a compiled loop is one graph node (not an unrolled body).
torch exposes ``torch._higher_order_ops.while_loop`` only as a prototype and ``scan``
not at all. Versions: both trace on torch 2.11 to 2.14; inductor's C++ wrapper compiles
them on the CPU from torch 2.13 (2.11 and 2.12 assert in ``codegen_while_loop``: fd.jit
takes inductor's Python wrapper for such a graph there, ``functd._torch.CPP_WRAPPER_LOOPS``).

>>> from functd._torch.hop import scan, scan_op, while_loop, while_loop_op
>>> scan_op.name()
'scan'
"""

from __future__ import annotations

from torch._higher_order_ops.scan import scan, scan_op
from torch._higher_order_ops.while_loop import while_loop, while_loop_op

__all__ = ["scan", "scan_op", "while_loop", "while_loop_op"]

# - ``scan(combine, init, xs, reverse=...)``: the scan op's user entry (fd.scan under
#   dynamo); ``scan_op``: the operator itself (fd.scan's trace and its vmap rule);
# - ``while_loop(cond, body, carry)``: the while op's entry (fd.while_loop under
#   dynamo); ``while_loop_op``: the operator (fd.while_loop's trace).

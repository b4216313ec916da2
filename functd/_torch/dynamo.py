"""dynamo's counters and its C++ tensor guards (``torch._dynamo``, ``torch._C._dynamo``).

Importing this module imports ``torch._dynamo.utils`` (seconds on a cold process):
import it inside the function that needs it. Versions: behaves as used on torch 2.11
to 2.14 (issue 37's runs).

>>> from functd._torch.dynamo import counters
>>> "stats" in counters or not counters
True
"""

from __future__ import annotations

from torch._C._dynamo.guards import TensorGuards
from torch._dynamo.utils import counters

__all__ = ["TensorGuards", "counters"]

# - ``counters``: dynamo's process-wide statistics: ``counters["stats"]["unique_graphs"]``
#   (graphs compiled) and ``counters["graph_break"]`` (reason -> count);
#   functd.testing's compile assertions read them;
# - ``TensorGuards(*tensors, dynamic_dims_sizes=..., dynamic_dims_strides=...)``: one C++
#   check of many tensors' type, dispatch keys, shapes, strides, dtype, device and
#   requires_grad (~0.1 µs a tensor); fd.jit matches a call to its compiled entry with it.

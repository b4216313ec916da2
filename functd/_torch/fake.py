"""Fake tensors and the tracing context: what fd.jit traces on and what fd.scan's step
shape inference runs under (``torch._subclasses.fake_tensor``, ``torch._guards``).

torch has no public fake-tensor API yet (``torch.export`` and ``torch.compile`` use
these internally). Versions: behaves as used on torch 2.11 to 2.14 (issue 37's runs).

>>> import torch
>>> from functd._torch.fake import FakeTensor, FakeTensorMode
>>> with FakeTensorMode():
...     isinstance(torch.zeros(2), FakeTensor)
True
"""

from __future__ import annotations

from torch._guards import TracingContext, detect_fake_mode, tracing
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedFakeTensorException,
    UnsupportedOperatorException,
)

__all__ = [
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "FakeTensor",
    "FakeTensorMode",
    "TracingContext",
    "UnsupportedFakeTensorException",
    "UnsupportedOperatorException",
    "detect_fake_mode",
    "tracing",
]

# - ``FakeTensor``/``FakeTensorMode``: tensors with shapes, dtypes and devices but no
#   data; fd.jit traces the user's function on them (with a ShapeEnv for dynamic dims),
#   fd.scan infers a step's output structure under one, fd.jit's passes rebuild a
#   node's value under the graph's mode;
# - the exceptions: what a fake trace raises when Python needs a tensor's value
#   (``DataDependentOutputException``), an output's shape depends on values
#   (``DynamicOutputShapeException``) or an op has no fake kernel
#   (``UnsupportedOperatorException``, ``UnsupportedFakeTensorException``): fd.jit turns
#   them into TransformErrors that name the user's line; fd.scan falls back to zeros;
# - ``detect_fake_mode(tensors)``: the fake mode a traced value belongs to;
# - ``tracing(TracingContext(mode))``: makes a fake mode current for inductor (a graph
#   without tensor inputs).

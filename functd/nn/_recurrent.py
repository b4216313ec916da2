"""Recurrent cells: RNNCell, GRUCell, LSTMCell (one step; the state is passed in and out).

The cells are written with ``F.linear`` and elementwise ops, in the order of
ATen's CPU implementation (``aten/src/ATen/native/RNN.cpp``), rather than
through ``torch.gru_cell``/``torch.lstm_cell``: those have no ``vmap``
batching rule (``lstm_cell`` cannot be vmapped at all, the others fall back to
a slow per-sample loop), and ensembles of cells under ``vmap`` are the common
case here. On CPU the numbers are torch's; on CUDA torch's module uses fused
kernels, which agree to rounding.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .._td import TensorDict
from ._base import Layer, ParamSpec, fan_in_bound, uniform

__all__ = ["GRUCell", "LSTMCell", "RNNCell", "elman_step", "gru_step", "lstm_step"]


# The steps, shared with the multi-layer RNN/GRU/LSTM (``_rnn.py``): ``gi`` is the input
# projection ``F.linear(x, weight_ih, bias_ih)``, which those compute for every time step
# at once, as ATen's CPU code does.
def elman_step(gi: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None, relu: bool) -> Tensor:
    """``act(gi + h @ w_hh.T + b_hh)``: one step of an Elman RNN."""
    pre = gi + F.linear(h, w_hh, b_hh)
    return torch.relu(pre) if relu else torch.tanh(pre)


def gru_step(gi: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
    """One GRU step (gates in torch's order: reset, update, new)."""
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, -1)
    reset = torch.sigmoid(h_r + i_r)
    update = torch.sigmoid(h_z + i_z)
    new = torch.tanh(i_n + h_n * reset)
    return (h - new) * update + new


def lstm_step(
    gi: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    b_hh: Tensor | None,
    w_hr: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One LSTM step (gates in torch's order: input, forget, cell, output); with
    ``w_hr`` the new ``h`` is projected (``nn.LSTM(proj_size=...)``)."""
    i, f, g, o = (gi + F.linear(h, w_hh, b_hh)).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h if w_hr is None else F.linear(h, w_hr)), c


@dataclasses.dataclass(frozen=True)
class _CellBase(Layer):
    """What the cells share: the parameters, and (for the one-state cells) the call."""

    _chunks: ClassVar[int]

    input_size: int
    hidden_size: int
    bias: bool = True

    def _specs(self) -> dict[str, Any]:
        # torch: every parameter U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))
        init = uniform(fan_in_bound(self.hidden_size))
        rows = self._chunks * self.hidden_size
        specs = {
            "weight_ih": ParamSpec((rows, self.input_size), init),
            "weight_hh": ParamSpec((rows, self.hidden_size), init),
        }
        if self.bias:
            specs["bias_ih"] = ParamSpec((rows,), init)
            specs["bias_hh"] = ParamSpec((rows,), init)
        return specs

    def __call__(
        self, params: TensorDict, x: Tensor, h: Tensor | None = None, *, key: Tensor | None = None
    ) -> Tensor:
        """``cell(params, x, h=None)``: ``x`` of shape ``(N, input_size)`` or
        ``(input_size,)``; ``h=None`` starts from zeros. Returns ``h'``."""
        batched = x.dim() == 2
        if not batched:
            if x.dim() != 1:
                raise _bad_dims(self, "input", x)
            x = x.unsqueeze(0)
        if h is None:
            h = _zeros(x, self.hidden_size)
        elif h.dim() not in (1, 2):
            raise _bad_dims(self, "hidden", h)
        elif not batched:
            h = h.unsqueeze(0)
        out = self._step(params._data, x, h)
        return out if batched else out.squeeze(0)

    def _step(self, d: dict[str, Any], x: Tensor, h: Tensor) -> Tensor:
        """The new state from batched ``x`` and ``h`` (``d``: the parameters)."""
        raise NotImplementedError


def _bad_dims(cell: _CellBase, what: str, t: Tensor) -> ValueError:
    return ValueError(
        f"{type(cell).__name__}: Expected {what} to be 1D or 2D, got {t.dim()}D instead"
    )


def _zeros(x: Tensor, hidden_size: int) -> Tensor:
    return torch.zeros(x.size(0), hidden_size, dtype=x.dtype, device=x.device)


@dataclasses.dataclass(frozen=True)
class RNNCell(_CellBase):
    """An Elman cell: ``h' = act(x @ W_ih.T + b_ih + h @ W_hh.T + b_hh)``; as ``torch.nn.RNNCell``.

    Args:
        input_size: size of the input's last dim.
        hidden_size: size of the state.
        bias: whether to learn ``bias_ih`` and ``bias_hh``.
        nonlinearity: ``"tanh"`` or ``"relu"``.

    Call: ``cell(params, x, h=None)`` with ``x`` of shape ``(N, input_size)``
    or ``(input_size,)``; ``h=None`` starts from zeros. Returns ``h'``.

    Example:
        >>> cell = RNNCell(3, 5)
        >>> cell(cell.init(0), torch.zeros(2, 3)).shape
        torch.Size([2, 5])
    """

    _chunks: ClassVar[int] = 1

    nonlinearity: str = "tanh"

    def __post_init__(self) -> None:
        if self.nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {self.nonlinearity}")

    def _step(self, d: dict[str, Any], x: Tensor, h: Tensor) -> Tensor:
        gi = F.linear(x, d["weight_ih"], d.get("bias_ih"))
        return elman_step(gi, h, d["weight_hh"], d.get("bias_hh"), self.nonlinearity == "relu")


@dataclasses.dataclass(frozen=True)
class GRUCell(_CellBase):
    """A gated recurrent unit step; as ``torch.nn.GRUCell``.

    Takes the arguments of ``RNNCell`` but ``nonlinearity``, and is called as it is.

    Example:
        >>> cell = GRUCell(4, 8)
        >>> cell(cell.init(0), torch.zeros(2, 4), torch.zeros(2, 8)).shape
        torch.Size([2, 8])
    """

    _chunks: ClassVar[int] = 3

    def _step(self, d: dict[str, Any], x: Tensor, h: Tensor) -> Tensor:
        gi = F.linear(x, d["weight_ih"], d.get("bias_ih"))
        return gru_step(gi, h, d["weight_hh"], d.get("bias_hh"))


@dataclasses.dataclass(frozen=True)
class LSTMCell(_CellBase):
    """A long short-term memory step; as ``torch.nn.LSTMCell``.

    Takes the arguments of ``RNNCell`` but ``nonlinearity``.

    Call: ``cell(params, x, h=None, c=None)`` (torch's ``hx=(h, c)`` as two
    arguments); a missing state starts from zeros. Returns ``(h', c')``.

    Example:
        >>> cell = LSTMCell(4, 8)
        >>> h, c = cell(cell.init(0), torch.zeros(2, 4))
        >>> h.shape, c.shape
        (torch.Size([2, 8]), torch.Size([2, 8]))
    """

    _chunks: ClassVar[int] = 4

    def __call__(  # type: ignore[override]
        self,
        params: TensorDict,
        x: Tensor,
        h: Tensor | None = None,
        c: Tensor | None = None,
        *,
        key: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        batched = x.dim() == 2
        if not batched:
            if x.dim() != 1:
                raise _bad_dims(self, "input", x)
            x = x.unsqueeze(0)
        if h is None or c is None:
            if (h is None) != (c is None):
                raise ValueError("LSTMCell: pass both h and c, or neither (zeros)")
            h = c = _zeros(x, self.hidden_size)
        else:
            if h.dim() not in (1, 2):
                raise _bad_dims(self, "hx[0]", h)
            if c.dim() not in (1, 2):
                raise _bad_dims(self, "hx[1]", c)
            if not batched:
                h, c = h.unsqueeze(0), c.unsqueeze(0)
        d = params._data
        gi = F.linear(x, d["weight_ih"], d.get("bias_ih"))
        h, c = lstm_step(gi, h, c, d["weight_hh"], d.get("bias_hh"))
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))

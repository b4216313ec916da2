"""One small case per public ``functd.nn`` layer, for conformance tests.

``LAYER_CASES[name] = (factory, example_inputs_factory)``: ``factory()``
returns the pure layer, ``example_inputs_factory()`` a tuple of example
tensors with a leading batch dim of 4 (float32; integer indices for
Embedding). A layer with ``layer.random`` needs ``key=`` at call time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import functd.nn as fnn

__all__ = ["LAYER_CASES"]

B = 4


def _x(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(B, *shape),)


def _xs(*shapes: tuple[int, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: tuple(torch.randn(B, *s) for s in shapes)


LAYER_CASES: dict[str, tuple[Callable[[], fnn.Layer], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "Linear": (lambda: fnn.Linear(3, 5), _x(3)),
    "Bilinear": (lambda: fnn.Bilinear(3, 2, 5), _xs((3,), (2,))),
    "Identity": (fnn.Identity, _x(3)),
    "Flatten": (fnn.Flatten, _x(2, 3)),
    "Conv1d": (lambda: fnn.Conv1d(2, 3, 3, padding=1), _x(2, 6)),
    "Conv2d": (lambda: fnn.Conv2d(2, 4, 3, stride=2, groups=2), _x(2, 7, 7)),
    "Conv3d": (lambda: fnn.Conv3d(1, 2, 2), _x(1, 3, 3, 3)),
    "ConvTranspose1d": (lambda: fnn.ConvTranspose1d(2, 3, 3, stride=2), _x(2, 4)),
    "ConvTranspose2d": (
        lambda: fnn.ConvTranspose2d(2, 3, 3, stride=2, output_padding=1),
        _x(2, 3, 3),
    ),
    "ConvTranspose3d": (lambda: fnn.ConvTranspose3d(2, 1, 2), _x(2, 2, 2, 2)),
    "Embedding": (
        lambda: fnn.Embedding(7, 3, padding_idx=0),
        lambda: (torch.randint(0, 7, (B, 5)),),
    ),
    # bags of 5 indices, 2 bags per sample (a 1-D input would need offsets)
    "EmbeddingBag": (
        lambda: fnn.EmbeddingBag(7, 3, mode="max", padding_idx=0),
        lambda: (torch.randint(0, 7, (B, 2, 5)),),
    ),
    "Unflatten": (lambda: fnn.Unflatten(-1, (2, 3)), _x(6)),
    "LayerNorm": (lambda: fnn.LayerNorm(5), _x(5)),
    "GroupNorm": (lambda: fnn.GroupNorm(2, 4), _x(4, 4)),  # valid batched and per sample
    "RMSNorm": (lambda: fnn.RMSNorm(5), _x(5)),
    # eval mode (training mode returns (y, new_state): tests/test_nn_batchnorm.py and the
    # stateful conformance entries); square shapes: valid batched and per sample
    "BatchNorm1d": (lambda: fnn.BatchNorm1d(3, training=False), _x(3, 3)),
    "BatchNorm2d": (lambda: fnn.BatchNorm2d(2, momentum=None, training=False), _x(2, 2, 3)),
    "BatchNorm3d": (lambda: fnn.BatchNorm3d(2, affine=False, training=False), _x(2, 2, 2, 2)),
    "RNNCell": (lambda: fnn.RNNCell(3, 5), _xs((3,), (5,))),
    "GRUCell": (lambda: fnn.GRUCell(3, 5), _xs((3,), (5,))),
    "LSTMCell": (lambda: fnn.LSTMCell(3, 5), _xs((3,), (5,), (5,))),
    # whole sequences, batch_first: (B, L=4, 3); one sample is an unbatched (L, 3). The
    # states come out (layers * dirs, B, H), as torch's (see conformance._batch_first).
    "RNN": (
        lambda: fnn.RNN(3, 5, 2, "relu", batch_first=True, bidirectional=True, training=False),
        _x(4, 3),
    ),
    "GRU": (lambda: fnn.GRU(3, 5, batch_first=True, bias=False), _x(4, 3)),
    # training with inter-layer dropout: random (keyed), and projected
    "LSTM": (lambda: fnn.LSTM(3, 5, 2, batch_first=True, dropout=0.5, proj_size=2), _x(4, 3)),
    "MaxPool1d": (lambda: fnn.MaxPool1d(3, 2, padding=1, ceil_mode=True), _x(2, 9)),
    "MaxPool2d": (lambda: fnn.MaxPool2d(3, 2, 1, dilation=1, return_indices=True), _x(2, 7, 7)),
    "MaxPool3d": (lambda: fnn.MaxPool3d(2, dilation=(1, 1, 2)), _x(2, 4, 4, 5)),
    "AvgPool1d": (lambda: fnn.AvgPool1d(3, 2, 1, count_include_pad=False), _x(2, 9)),
    "AvgPool2d": (lambda: fnn.AvgPool2d(3, 2, 1, ceil_mode=True, divisor_override=2), _x(2, 7, 7)),
    "AvgPool3d": (lambda: fnn.AvgPool3d(2), _x(1, 4, 4, 4)),
    "LPPool1d": (lambda: fnn.LPPool1d(2, 3), _x(2, 9)),
    "LPPool2d": (lambda: fnn.LPPool2d(2.0, 2, stride=1), _x(2, 5, 5)),  # odd p: NaN for x < 0
    "LPPool3d": (lambda: fnn.LPPool3d(2, 2), _x(1, 4, 4, 4)),
    "AdaptiveMaxPool1d": (lambda: fnn.AdaptiveMaxPool1d(4, return_indices=True), _x(2, 9)),
    "AdaptiveMaxPool2d": (lambda: fnn.AdaptiveMaxPool2d((3, None)), _x(2, 7, 5)),
    "AdaptiveMaxPool3d": (lambda: fnn.AdaptiveMaxPool3d(2), _x(1, 4, 5, 3)),
    "AdaptiveAvgPool1d": (lambda: fnn.AdaptiveAvgPool1d(4), _x(2, 9)),
    "AdaptiveAvgPool2d": (lambda: fnn.AdaptiveAvgPool2d((3, None)), _x(2, 7, 5)),
    "AdaptiveAvgPool3d": (lambda: fnn.AdaptiveAvgPool3d((2, None, 1)), _x(1, 4, 5, 3)),
    "Pad": (lambda: fnn.Pad((1, 2, 0, 1), "reflect"), _x(2, 4, 5)),
    # nearest: valid on a sample (N, C, H, W) and on the batch (5-D: 3d nearest)
    "Upsample": (lambda: fnn.Upsample(scale_factor=2), _x(2, 3, 4, 4)),
    "PixelShuffle": (lambda: fnn.PixelShuffle(2), _x(8, 3, 3)),
    "PixelUnshuffle": (lambda: fnn.PixelUnshuffle(2), _x(2, 4, 4)),
    "MultiheadAttention": (
        lambda: fnn.MultiheadAttention(8, 2, batch_first=True),
        _xs((5, 8), (6, 8), (6, 8)),
    ),
    "Dropout": (lambda: fnn.Dropout(0.5), _x(6)),
    "MLP": (lambda: fnn.MLP(3, 2, num_cells=(8, 8)), _x(3)),
    "Chain": (lambda: fnn.Chain((fnn.Linear(3, 8), fnn.Tanh(), fnn.Linear(8, 2))), _x(3)),
    "PReLU": (lambda: fnn.PReLU(3), _x(3)),
    "ReLU": (fnn.ReLU, _x(5)),
    "ReLU6": (fnn.ReLU6, _x(5)),
    "LeakyReLU": (lambda: fnn.LeakyReLU(0.2), _x(5)),
    "ELU": (lambda: fnn.ELU(0.5), _x(5)),
    "CELU": (lambda: fnn.CELU(0.5), _x(5)),
    "SELU": (fnn.SELU, _x(5)),
    "GELU": (lambda: fnn.GELU("tanh"), _x(5)),
    "SiLU": (fnn.SiLU, _x(5)),
    "Mish": (fnn.Mish, _x(5)),
    "Sigmoid": (fnn.Sigmoid, _x(5)),
    "Tanh": (fnn.Tanh, _x(5)),
    "Hardtanh": (lambda: fnn.Hardtanh(-0.5, 0.5), _x(5)),
    "Hardsigmoid": (fnn.Hardsigmoid, _x(5)),
    "Hardswish": (fnn.Hardswish, _x(5)),
    "Softplus": (lambda: fnn.Softplus(2.0, 10.0), _x(5)),
    "Softsign": (fnn.Softsign, _x(5)),
    "Tanhshrink": (fnn.Tanhshrink, _x(5)),
    "LogSigmoid": (fnn.LogSigmoid, _x(5)),
    "Softmax": (lambda: fnn.Softmax(-1), _x(5)),
    "LogSoftmax": (lambda: fnn.LogSoftmax(-1), _x(5)),
}

"""Pure layers: frozen dataclasses of static config; parameters are passed in.

Every layer follows one protocol: ``layer.init(key)`` draws a TensorDict of
parameters named exactly like the matching torch module's ``state_dict()``,
and ``layer(params, *inputs, key=None)`` is a pure function. ``lower`` maps a
torch module onto its pure layer; ``FunctionalCall`` runs any other module;
``state_to_td`` / ``load_td`` move weights between the two worlds. See
``functd/nn/README.md`` for why the code looks the way it does.

Example:
    >>> import torch, functd as fd, functd.nn as fnn
    >>> mlp = fnn.MLP(3, 1, num_cells=(32, 32))
    >>> params = mlp.init(fd.random.key(0))
    >>> mlp(params, torch.zeros(8, 3)).shape
    torch.Size([8, 1])
    >>> layer = fnn.lower(torch.nn.Linear(3, 4))
    >>> layer == fnn.Linear(3, 4)
    True
"""

from ._activation import CELU as CELU
from ._activation import ELU as ELU
from ._activation import GELU as GELU
from ._activation import SELU as SELU
from ._activation import Hardsigmoid as Hardsigmoid
from ._activation import Hardswish as Hardswish
from ._activation import Hardtanh as Hardtanh
from ._activation import LeakyReLU as LeakyReLU
from ._activation import LogSigmoid as LogSigmoid
from ._activation import LogSoftmax as LogSoftmax
from ._activation import Mish as Mish
from ._activation import PReLU as PReLU
from ._activation import ReLU as ReLU
from ._activation import ReLU6 as ReLU6
from ._activation import Sigmoid as Sigmoid
from ._activation import SiLU as SiLU
from ._activation import Softmax as Softmax
from ._activation import Softplus as Softplus
from ._activation import Softsign as Softsign
from ._activation import Tanh as Tanh
from ._activation import Tanhshrink as Tanhshrink
from ._attention import MultiheadAttention as MultiheadAttention
from ._base import Layer as Layer
from ._base import ParamSpec as ParamSpec
from ._batchnorm import BatchNorm1d as BatchNorm1d
from ._batchnorm import BatchNorm2d as BatchNorm2d
from ._batchnorm import BatchNorm3d as BatchNorm3d
from ._chain import Chain as Chain
from ._conv import Conv1d as Conv1d
from ._conv import Conv2d as Conv2d
from ._conv import Conv3d as Conv3d
from ._conv import ConvTranspose1d as ConvTranspose1d
from ._conv import ConvTranspose2d as ConvTranspose2d
from ._conv import ConvTranspose3d as ConvTranspose3d
from ._convert import load_td as load_td
from ._convert import state_to_td as state_to_td
from ._dropout import Dropout as Dropout
from ._embedding import Embedding as Embedding
from ._embedding import EmbeddingBag as EmbeddingBag
from ._linear import Bilinear as Bilinear
from ._linear import Flatten as Flatten
from ._linear import Identity as Identity
from ._linear import Linear as Linear
from ._linear import Unflatten as Unflatten
from ._lower import FunctionalCall as FunctionalCall
from ._lower import lower as lower
from ._mha import multi_head_attention_forward as multi_head_attention_forward
from ._mlp import MLP as MLP
from ._norm import GroupNorm as GroupNorm
from ._norm import LayerNorm as LayerNorm
from ._norm import RMSNorm as RMSNorm
from ._pool import AdaptiveAvgPool1d as AdaptiveAvgPool1d
from ._pool import AdaptiveAvgPool2d as AdaptiveAvgPool2d
from ._pool import AdaptiveAvgPool3d as AdaptiveAvgPool3d
from ._pool import AdaptiveMaxPool1d as AdaptiveMaxPool1d
from ._pool import AdaptiveMaxPool2d as AdaptiveMaxPool2d
from ._pool import AdaptiveMaxPool3d as AdaptiveMaxPool3d
from ._pool import AvgPool1d as AvgPool1d
from ._pool import AvgPool2d as AvgPool2d
from ._pool import AvgPool3d as AvgPool3d
from ._pool import LPPool1d as LPPool1d
from ._pool import LPPool2d as LPPool2d
from ._pool import LPPool3d as LPPool3d
from ._pool import MaxPool1d as MaxPool1d
from ._pool import MaxPool2d as MaxPool2d
from ._pool import MaxPool3d as MaxPool3d
from ._recurrent import GRUCell as GRUCell
from ._recurrent import LSTMCell as LSTMCell
from ._recurrent import RNNCell as RNNCell
from ._rnn import GRU as GRU
from ._rnn import LSTM as LSTM
from ._rnn import RNN as RNN
from ._sdpa import scaled_dot_product_attention as scaled_dot_product_attention
from ._spatial import Pad as Pad
from ._spatial import PixelShuffle as PixelShuffle
from ._spatial import PixelUnshuffle as PixelUnshuffle
from ._spatial import Upsample as Upsample
from ._state import buffer_paths as buffer_paths
from ._state import eval_mode as eval_mode
from ._state import merge_state as merge_state
from ._state import split_state as split_state
from ._state import train_mode as train_mode
from ._state import update_state as update_state

#: Every public pure layer class (the conformance registry checks each has a case).
LAYERS: tuple[type, ...] = (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    Bilinear,
    CELU,
    Chain,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    Dropout,
    ELU,
    Embedding,
    EmbeddingBag,
    Flatten,
    GELU,
    GroupNorm,
    GRU,
    GRUCell,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSigmoid,
    LogSoftmax,
    LPPool1d,
    LPPool2d,
    LPPool3d,
    LSTM,
    LSTMCell,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    Mish,
    MLP,
    MultiheadAttention,
    Pad,
    PixelShuffle,
    PixelUnshuffle,
    PReLU,
    ReLU,
    ReLU6,
    RMSNorm,
    RNN,
    RNNCell,
    SELU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Softsign,
    Tanh,
    Tanhshrink,
    Unflatten,
    Upsample,
)

"""Multi-layer RNN, GRU and LSTM over whole sequences, on the cells' steps.

``torch.nn.RNN/GRU/LSTM`` run one fused op (``torch._VF.lstm`` & co) that
has no ``vmap`` batching rule and that ``torch.compile`` only traces with
``allow_rnn``. These layers run the same math as a Python loop over time of
the steps in ``_recurrent.py`` (the input projection of every step computed
at once, as ATen's CPU code does), so ensembles vmap and the layer compiles
with ``fullgraph=True``. On plain eager CPU tensors (no ``vmap``/``grad``
wrapper, not compiling; ``functd._eager.plain``; in training with dropout the
key too, as an ensemble vmapped over keys alone batches the masks) the call
runs torch's fused op instead, once for the stack (once per layer when it
drops between layers): the same function at torch's speed (the loop is
1.8-3x slower, ``benchmarks/rnn.py``). ``run_stack`` serves the torch
modules inside a ``FunctionalCall`` in training mode the same way.

Parameters are named like the torch module's ``state_dict()``
(``weight_ih_l0``, ``bias_hh_l1_reverse``, ``weight_hr_l0``...). Inter-layer
dropout is keyed: in training mode with ``dropout > 0`` and more than one
layer the layer is ``random`` and draws its masks from the call's ``key``
(``RNN``'s docstring says how). The states keep torch's ``(layers * D, N,
H)`` layout unless ``batch_first_state=True`` puts the batch dim in front.
``PackedSequence`` inputs are refused (pad them).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from .. import random as fr
from .._eager import plain
from .._td import EMPTY, TensorDict
from .._torch.ops import VF
from ._base import Layer, ParamSpec, as_key, fan_in_bound, set_derived, uniform
from ._dropout import Dropout
from ._recurrent import elman_step, gru_step, lstm_step

__all__ = ["GRU", "LSTM", "RNN", "run_stack"]

KEY_REQUIRED = (
    "{name}(dropout={p}) in training mode drops between its {n} layers and needs a PRNG key: "
    "pass one at call time, e.g. `m(params, td, key=fd.random.key(0))` (a fresh key for "
    "each step), or switch it to eval mode (`fd.nn.eval_mode(m)`, `training=False`, or "
    "lower a module in eval()) where it does not drop."
)
PACKED = (
    "{name}: PackedSequence inputs are not supported by the pure layer; pass the padded "
    "batch (torch.nn.utils.rnn.pad_packed_sequence) and mask the padded steps yourself, "
    "or run the torch module directly."
)


class _RNNBase(Layer):
    """What RNN, GRU and LSTM share: checks, parameters and the loop over layers."""

    if TYPE_CHECKING:  # set with object.__setattr__ (frozen)
        _dirs: Any
        _drop: Any
        _h_shape: Any
        _names: Any
        batch_first: Any
        batch_first_state: Any
        bias: Any
        bidirectional: Any
        dropout: Any
        hidden_size: Any
        input_size: Any
        num_layers: Any
        training: Any

    _gates: ClassVar[int]
    _fused: ClassVar[Any]  # torch's fused op for one stack of layers

    def _check(self) -> None:
        object.__setattr__(self, "dropout", float(self.dropout))
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(
                f"{type(self).__name__}: dropout should be a number in range [0, 1] "
                f"representing the probability of an element being zeroed; got {self.dropout}"
            )
        if self.hidden_size <= 0:
            raise ValueError(f"{type(self).__name__}: hidden_size must be greater than zero")
        if self.num_layers <= 0:
            raise ValueError(f"{type(self).__name__}: num_layers must be greater than zero")
        dirs = 2 if self.bidirectional else 1
        out = self._out_size()
        names = []
        for layer in range(self.num_layers):
            for suffix in ("", "_reverse")[:dirs]:
                kinds = ["weight_ih", "weight_hh"] + ["bias_ih", "bias_hh"] * self.bias
                kinds += ["weight_hr"] * (out != self.hidden_size)
                names.append(tuple(f"{k}_l{layer}{suffix}" for k in kinds))
        set_derived(
            self,
            _dirs=dirs,
            _names=tuple(names),
            _drop=Dropout(self.dropout),
            _h_shape=(self.num_layers * dirs, out),
        )

    def _out_size(self) -> int:
        return self.hidden_size

    @property
    def random(self) -> bool:  # type: ignore[override]
        """True in training mode with ``dropout > 0`` and several layers: a call
        then needs a ``key`` for the masks between layers."""
        return self.training and self.dropout > 0.0 and self.num_layers > 1

    def _specs(self) -> dict[str, Any]:
        # torch: every parameter U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))
        init = uniform(fan_in_bound(self.hidden_size))
        rows, out = self._gates * self.hidden_size, self._out_size()
        specs = {}  # type: ignore[var-annotated]
        for i, names in enumerate(self._names):
            inputs = self.input_size if i < self._dirs else out * self._dirs
            shapes = [(rows, inputs), (rows, out)] + [(rows,), (rows,)] * self.bias
            shapes += [(out, self.hidden_size)] * (len(names) > len(shapes))
            specs.update((n, ParamSpec(s, init)) for n, s in zip(names, shapes))
        return specs

    # --------------------------------------------------------------- the call
    def _inputs(self, x: Any, hx: Tensor | None, what: str) -> tuple[Tensor, bool]:
        """Check the input's and state's ranks and sizes as torch's ``forward`` does."""
        name = type(self).__name__
        if not isinstance(x, Tensor):
            if isinstance(x, PackedSequence):
                raise TypeError(PACKED.format(name=name))
            raise TypeError(f"{name}: input must be a tensor; got {type(x).__name__}")
        if x.dim() not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {x.dim()}D instead")
        if x.size(-1) != self.input_size:
            raise ValueError(
                f"{name}: input.size(-1) must be equal to input_size. Expected "
                f"{self.input_size}, got {x.size(-1)}"
            )
        batched = x.dim() == 3
        if hx is not None and hx.dim() != x.dim():
            kind = "batched 3-D" if batched else "unbatched 2-D"
            raise ValueError(
                f"{name}: For {kind} input, {what} should also be {x.dim()}-D but got "
                f"{hx.dim()}-D tensor"
            )
        return x, batched

    def _state(
        self, hx: Tensor | None, n: int, x: Tensor, size: int, what: str, front: bool
    ) -> Tensor:
        """The initial state ``(layers * dirs, n, size)``: ``hx`` checked (in the
        caller's layout: ``(n, layers * dirs, size)`` when ``front``), or zeros."""
        shape = (self.num_layers * self._dirs, n, size)
        if hx is None:
            return x.new_zeros(shape)
        given = (n, shape[0], size) if front else shape
        if tuple(hx.shape) != given:
            hint = " (batch_first_state=True: batch first)" if front else ""
            raise ValueError(
                f"{type(self).__name__}: Expected {what} size {given}{hint}, got {list(hx.shape)}"
            )
        return hx.transpose(0, 1) if front else hx

    def _layers(
        self, d: dict[str, Tensor], x: Tensor, h0: Tensor, c0: Tensor | None, key: Any
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Run the stack on batched ``x`` (in ``batch_first``'s layout, as torch's forward
        hands it to the fused op); ``(output, h_n, c_n or None)``."""
        weights = [[d[n] for n in names] for names in self._names]
        drop = self.random
        if drop and key is None:
            raise ValueError(
                KEY_REQUIRED.format(name=type(self).__name__, p=self.dropout, n=self.num_layers)
            )
        keys = fr.split(as_key(key), self.num_layers - 1) if drop else None
        # the keys too: under vmap over keys alone the masks, then the next layer's
        # input, are batched, which the fused op cannot take
        tensors = [x, h0, *(w for ws in weights for w in ws), *([keys] if drop else [])]
        fused = self._fusable(x) and plain(tensors)
        if fused and not drop:  # one fused call for the whole stack: torch's own call
            return self._fused_call(weights, x, h0, c0, self.num_layers)
        if not fused and self.batch_first:  # the loop runs time-major
            x = x.transpose(0, 1)
        dirs, hs, cs = self._dirs, [], []
        for layer in range(self.num_layers):
            rows = slice(layer * dirs, (layer + 1) * dirs)
            ws, c = weights[rows], None if c0 is None else c0[rows]
            if fused:
                x, h, c = self._fused_call(ws, x, h0[rows], c, 1)
            else:
                x, h, c = self._loop_layer(ws, x, h0[rows], c)
            if drop and layer < self.num_layers - 1:  # masks drawn time-major on both paths
                swap = fused and self.batch_first
                y = self._drop(EMPTY, x.transpose(0, 1) if swap else x, key=keys[layer])
                x = y.transpose(0, 1) if swap else y
            hs.append(h)
            cs.append(c)
        if not fused and self.batch_first:
            x = x.transpose(0, 1)
        return x, torch.cat(hs), None if c0 is None else torch.cat(cs)

    def _fusable(self, x: Tensor) -> bool:
        """Whether torch's fused op may run (then only on plain tensors): on CPU."""
        return x.device.type == "cpu"

    def _fused_call(
        self, weights: list[Any], x: Tensor, h0: Tensor, c0: Tensor | None, n: int
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        flat = [w for ws in weights for w in ws]
        hx = h0 if c0 is None else (h0, c0)
        out = self._fused(
            x, hx, flat, self.bias, n, 0.0, False, self.bidirectional, self.batch_first
        )
        return out[0], out[1], out[2] if c0 is not None else None

    def _loop_layer(
        self, weights: list[Any], x: Tensor, h0: Tensor, c0: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """One layer (both directions) as a Python loop over time: vmaps and compiles."""
        outs, hs, cs = [], [], []
        for direction, ws in enumerate(weights):
            w_ih, w_hh, *rest = ws
            b_ih, b_hh = rest[:2] if self.bias else (None, None)
            w_hr = rest[-1] if len(rest) % 2 else None
            steps = F.linear(x, w_ih, b_ih).unbind(0)  # every step's input projection at once
            h, c = h0[direction], None if c0 is None else c0[direction]
            ys = []
            for gi in reversed(steps) if direction else steps:
                h, c = self._step(gi, h, c, w_hh, b_hh, w_hr)
                ys.append(h)
            if direction:
                ys.reverse()
            outs.append(torch.stack(ys))
            hs.append(h)
            cs.append(c)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
        return out, torch.stack(hs), None if c0 is None else torch.stack(cs)

    def _step(
        self, gi: Tensor, h: Tensor, c: Any, w_hh: Tensor, b_hh: Any, w_hr: Any
    ) -> tuple[Any, ...]:
        raise NotImplementedError

    def _run(
        self, params: TensorDict, x: Any, hx: Tensor | None, cx: Tensor | None, key: Any
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Shared body of the calls: layout in, stack, layout out."""
        lstm = self._gates == 4
        x, batched = self._inputs(x, hx, "hx and cx" if lstm else "hx")
        batch = 0 if self.batch_first else 1  # torch's layout, kept to the fused op
        if not batched:
            x = x.unsqueeze(batch)
            hx = None if hx is None else hx.unsqueeze(1)
            cx = None if cx is None else cx.unsqueeze(1)
        n, front = x.size(batch), self.batch_first_state and batched  # unbatched: one layout
        h0 = self._state(hx, n, x, self._h_shape[1], "hidden[0]" if lstm else "hidden", front)
        c0 = self._state(cx, n, x, self.hidden_size, "hidden[1]", front) if lstm else None
        out, h, c = self._layers(params._data, x, h0, c0, key)
        if not batched:
            return out.squeeze(batch), h.squeeze(1), None if c is None else c.squeeze(1)
        if self.batch_first_state:  # (n, layers * dirs, size): the batch dim in front
            return out, h.transpose(0, 1), None if c is None else c.transpose(0, 1)
        return out, h, c


@dataclasses.dataclass(frozen=True)
class RNN(_RNNBase):
    """A multi-layer Elman RNN over a sequence; as ``torch.nn.RNN``.

    Args:
        input_size: size of the input's last dim.
        hidden_size: size of the state.
        num_layers: stacked layers (each one's output is the next one's input).
        nonlinearity: ``"tanh"`` or ``"relu"``.
        bias: whether to learn ``bias_ih_l*`` and ``bias_hh_l*``.
        batch_first: inputs and outputs are ``(N, L, *)`` instead of ``(L, N, *)``.
        dropout: dropout on the outputs of every layer but the last, in training mode.
        bidirectional: also run each layer backwards in time and concatenate.
        training: training mode (the dropout is on); ``fd.nn.eval_mode`` switches it.
        batch_first_state: (keyword, functd's own) the states ``hx``/``h_n`` (and
            LSTM's ``c``) are ``(N, num_layers * D, size)``, the batch dim in front,
            instead of torch's ``(num_layers * D, N, size)``; unbatched states
            are unchanged. Then a TensorDict with batch dims ``[N]`` holds the
            state next to the input (``fd.Module(layer, ["x", "h"], ["y", "h"])``),
            and an ensemble vmapped over its members stacks it as
            ``(members, N, num_layers * D, size)``: every batch dim in front,
            as the input's. A lowered module gets it with
            ``dataclasses.replace(fd.nn.lower(module), batch_first_state=True)``
            (the parameters are the same).

    Call: ``rnn(params, input, hx=None, key=None)`` with ``input`` of shape
    ``(L, N, input_size)`` (``(N, L, input_size)`` with ``batch_first``) or
    unbatched ``(L, input_size)``, ``hx`` of shape ``(num_layers * D, N,
    hidden_size)`` (or ``(num_layers * D, hidden_size)``); None starts from
    zeros. Returns ``(output, h_n)``, as torch. ``key`` is needed when
    ``random`` (training, ``dropout > 0``, several layers).

    Dropout between layers: layer ``i``'s output (both directions, before
    layer ``i + 1``) is ``keyed_dropout(y, p, split(key, num_layers - 1)[i])``,
    the mask ``bernoulli(1 - p)`` over the time-major ``(L, N, D * size)``
    output and the kept values scaled by ``1 / (1 - p)``: torch's
    ``F.dropout`` between layers, never on the last layer's output, drawn
    from the key instead of torch's generator. An ensemble vmapped over keys
    draws one mask per member key (a loop over the members with their keys
    gives the same numbers); members sharing one key share its masks.
    Training runs under ``fd.vmap`` (over keys, params, inputs) and
    ``fd.grad`` through the loop over time.

    Parameters: as ``nn.RNN``'s ``state_dict()``, all ``U(±1/sqrt(hidden_size))``.

    Raises:
        ValueError: a bad config (as torch's), or at call time a bad input
            or state shape, or a missing key.
        TypeError: a ``PackedSequence`` input.

    Example:
        >>> rnn = RNN(3, 5, num_layers=2)
        >>> out, h = rnn(rnn.init(0), torch.zeros(7, 2, 3))
        >>> out.shape, h.shape
        (torch.Size([7, 2, 5]), torch.Size([2, 2, 5]))
        >>> front = RNN(3, 5, num_layers=2, batch_first=True, batch_first_state=True)
        >>> front(rnn.init(0), torch.zeros(4, 7, 3))[1].shape  # (N, layers, hidden)
        torch.Size([4, 2, 5])
    """

    _gates: ClassVar[int] = 1

    input_size: int
    hidden_size: int
    num_layers: int = 1
    nonlinearity: str = "tanh"
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    training: bool = True
    batch_first_state: bool = dataclasses.field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: Unknown nonlinearity {self.nonlinearity!r}")
        self._check()

    @property
    def _fused(self) -> Any:
        return VF.rnn_tanh if self.nonlinearity == "tanh" else VF.rnn_relu

    def _step(
        self, gi: Tensor, h: Tensor, c: Any, w_hh: Tensor, b_hh: Any, w_hr: Any
    ) -> tuple[Any, ...]:
        return elman_step(gi, h, w_hh, b_hh, self.nonlinearity == "relu"), None

    def __call__(
        self, params: TensorDict, input: Any, hx: Tensor | None = None, *, key: Any = None
    ) -> tuple[Tensor, Tensor]:
        out, h, _ = self._run(params, input, hx, None, key)
        return out, h


@dataclasses.dataclass(frozen=True)
class GRU(_RNNBase):
    """A multi-layer gated recurrent unit over a sequence; as ``torch.nn.GRU``.

    Takes the arguments of ``RNN`` but ``nonlinearity``, and is called as it is.

    Example:
        >>> gru = GRU(3, 5, batch_first=True, bidirectional=True)
        >>> out, h = gru(gru.init(0), torch.zeros(2, 7, 3))
        >>> out.shape, h.shape
        (torch.Size([2, 7, 10]), torch.Size([2, 2, 5]))
    """

    _gates: ClassVar[int] = 3
    _fused: ClassVar[Any] = staticmethod(VF.gru)

    input_size: int
    hidden_size: int
    num_layers: int = 1
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    training: bool = True
    batch_first_state: bool = dataclasses.field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        self._check()

    def _step(
        self, gi: Tensor, h: Tensor, c: Any, w_hh: Tensor, b_hh: Any, w_hr: Any
    ) -> tuple[Any, ...]:
        return gru_step(gi, h, w_hh, b_hh), None

    def __call__(
        self, params: TensorDict, input: Any, hx: Tensor | None = None, *, key: Any = None
    ) -> tuple[Tensor, Tensor]:
        out, h, _ = self._run(params, input, hx, None, key)
        return out, h


@dataclasses.dataclass(frozen=True)
class LSTM(_RNNBase):
    """A multi-layer long short-term memory over a sequence; as ``torch.nn.LSTM``.

    Takes the arguments of ``GRU``, and ``proj_size``: when > 0 each layer's
    ``h`` is projected to that size by ``weight_hr_l*`` (``h_n`` and the
    output then have ``proj_size`` features, ``c_n`` keeps ``hidden_size``).

    Call: ``lstm(params, input, hx=None, cx=None, key=None)``; torch's
    ``hx=(h_0, c_0)`` is accepted too, or the two states as two arguments
    (both or neither). Returns ``(output, (h_n, c_n))``, as torch. With
    ``batch_first_state`` both states are ``(N, num_layers * D, size)``.

    Example:
        >>> lstm = LSTM(3, 5, num_layers=2)
        >>> out, (h, c) = lstm(lstm.init(0), torch.zeros(7, 2, 3))
        >>> out.shape, h.shape, c.shape
        (torch.Size([7, 2, 5]), torch.Size([2, 2, 5]), torch.Size([2, 2, 5]))
    """

    _gates: ClassVar[int] = 4
    _fused: ClassVar[Any] = staticmethod(VF.lstm)

    input_size: int
    hidden_size: int
    num_layers: int = 1
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    proj_size: int = 0
    training: bool = True
    batch_first_state: bool = dataclasses.field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        if self.proj_size < 0:
            raise ValueError("LSTM: proj_size should be a positive integer or zero to disable")
        if self.proj_size >= self.hidden_size:
            raise ValueError("LSTM: proj_size has to be smaller than hidden_size")
        self._check()

    def _out_size(self) -> int:
        return self.proj_size or self.hidden_size

    def _fusable(self, x: Tensor) -> bool:
        # torch's CPU op warns on every projected float32/bfloat16/half call (oneDNN has
        # no projections) before it falls back to its own loop: use ours there
        return x.device.type == "cpu" and (not self.proj_size or x.dtype == torch.float64)

    def _step(
        self, gi: Tensor, h: Tensor, c: Any, w_hh: Tensor, b_hh: Any, w_hr: Any
    ) -> tuple[Any, ...]:
        return lstm_step(gi, h, c, w_hh, b_hh, w_hr)

    def __call__(
        self,
        params: TensorDict,
        input: Any,
        hx: Tensor | tuple[Tensor, Tensor] | None = None,
        cx: Tensor | None = None,
        *,
        key: Any = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if isinstance(hx, tuple | list):
            if cx is not None or len(hx) != 2:
                raise ValueError("LSTM: pass hx=(h_0, c_0) as torch does, or hx and cx, not both")
            hx, cx = hx
        if (hx is None) != (cx is None):
            raise ValueError("LSTM: pass both h_0 and c_0 (hx=(h_0, c_0)), or neither (zeros)")
        out, h, c = self._run(params, input, hx, cx, key)
        return out, (h, c)  # type: ignore[return-value]


# ---------------------------------------------- torch's fused call, for torch modules
def run_stack(name: str, *args: Any) -> tuple[Tensor, ...]:
    """``torch._VF.<name>(*args)`` (``name``: ``lstm``, ``gru``, ``rnn_tanh``,
    ``rnn_relu``; the padded form, no dropout) where it can run, else the layers'
    loop over time: what ``KeyedRandom`` (``_keyed.py``) runs for the
    ``nn.LSTM``/``GRU``/``RNN`` inside a torch module called in training mode,
    so that module vmaps (the fused op has no batching rule) and compiles.

    ``args`` are the fused op's: ``(input, hx, weights, has_biases, num_layers,
    dropout, train, bidirectional, batch_first)``, ``hx`` LSTM's ``(h, c)`` or
    one tensor, in torch's layout; the caller drops between layers itself.

    Example:
        >>> m = torch.nn.GRU(3, 4)
        >>> args = (torch.zeros(5, 2, 3), torch.zeros(1, 2, 4), list(m.parameters()))
        >>> run_stack("gru", *args, True, 1, 0.0, False, False, False)[1].shape
        torch.Size([1, 2, 4])
    """
    x, hx, weights, bias, layers, p, train, bidir, batch_first = args
    lstm = name == "lstm"
    states: list[Tensor] = list(hx) if lstm else [hx]
    if plain([x, *states, *weights]):
        return tuple(_FUSED[name](*args))
    h0, c0 = (states[0], states[1]) if lstm else (states[0], None)
    if train and p > 0 and layers > 1:
        raise ValueError(f"run_stack({name!r}): drop between layers in the caller (p={p})")
    hidden = weights[1].shape[-1] if c0 is None else c0.shape[-1]
    proj = h0.shape[-1] if lstm and h0.shape[-1] != hidden else 0
    stack = _stack(name, x.shape[-1], hidden, layers, bias, bidir, batch_first, proj)
    d = dict(zip((n for names in stack._names for n in names), weights, strict=True))
    out, h, c = stack._layers(d, x, h0, c0, None)
    return (out, h) if c is None else (out, h, c)


_FUSED = {n: getattr(VF, n) for n in ("lstm", "gru", "rnn_tanh", "rnn_relu")}


_STACKS: dict[tuple[Any, ...], _RNNBase] = {}  # config (str, ints, bools) -> layer


def _stack(
    name: str, size: int, hidden: int, layers: int, bias: bool, bidir: bool, bf: bool, proj: int
) -> _RNNBase:
    """The eval-mode layer of one fused call's config (kept, 64 configs at most, but
    not while compiling: dynamo cannot store a new layer in a global)."""
    config = (name, size, hidden, layers, bias, bidir, bf, proj)
    layer = _STACKS.get(config)
    if layer is not None:
        return layer
    kw = {"num_layers": layers, "bias": bias, "batch_first": bf, "bidirectional": bidir}
    if name == "lstm":
        layer = LSTM(size, hidden, proj_size=proj, training=False, **kw)
    elif name == "gru":
        layer = GRU(size, hidden, training=False, **kw)
    else:
        layer = RNN(size, hidden, nonlinearity=name[4:], training=False, **kw)
    if not torch.compiler.is_compiling():
        if len(_STACKS) >= 64:
            _STACKS.clear()
        _STACKS[config] = layer
    return layer

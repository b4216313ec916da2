"""How a module writes its outputs into the working dict of a call.

Example:
    >>> m = fd.Module(lambda x: fd.TensorDict({"b": x}, []), ["a"], ["b"])
    >>> m(None, fd.TensorDict({"a": torch.ones(2)}, []))["b"]  # read by key
    tensor([1., 1.])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import _errors as E
from .._td import Key, TensorDict, from_parts, set_path

__all__ = ["_write", "_write_outputs"]

_Tensor = torch.Tensor
_NOPE = object()


def _write_outputs(self: Any, data: dict, bs: torch.Size, out: Any) -> None:
    outs = getattr(self, "_out_all", self.out_keys)
    sel = self.out_keys
    if len(outs) == 1 and isinstance(out, torch.Tensor):
        _write(self, data, bs, outs[0], out)
        return
    if isinstance(out, Mapping) or (
        type(out) is TensorDict and (len(outs) > 1 or all(k in out for k in outs))
    ):
        # read by key (a dict, or a TensorDict that holds the out_keys, as tensordict
        # does); a TensorDict without the one out_key is a value written under it
        for k in outs:
            if k not in out:
                raise KeyError(
                    f"{self._label()}: the function returned a mapping without {E.fmt_key(k)}; it has {E.fmt_keys(out.keys())}."
                )
            if k in sel:
                _write(self, data, bs, k, out[k])
        return
    if not isinstance(out, tuple | list):
        out = (out,)
    if len(out) != len(outs):  # nested tuples, as nn.LSTM's (output, (h_n, c_n)): flattened
        flat = _flat(out)
        out = flat if len(flat) == len(outs) else out
    if len(out) != len(outs):
        raise ValueError(
            f"{self._label()}: the function returned {len(out)} output(s) but out_keys has "
            f"{len(outs)} ({E.fmt_keys(outs)}); give one out_key per output."
        )
    for k, v in zip(outs, out):
        if sel is outs or k in sel:
            _write(self, data, bs, k, v)


def _flat(out: tuple | list) -> tuple:
    return tuple(x for v in out for x in (_flat(v) if isinstance(v, tuple | list) else (v,)))


REDUCED = (
    " An output reduced over the batch (a loss, a mean: an HF model's `loss`) cannot be an "
    "entry of a tensordict of batch size {bs}, whose every entry starts with the batch dims. "
    "Read it with the keyword form, which returns the tensors: `loss = m(params, x=x, ...)`; "
    "or call on a tensordict of batch size [], `m(params, fd.TensorDict(td, batch_size=[]))`; "
    "or leave {key} out of out_keys and compute it from the other outputs."
)


RNN_STATE = (
    " A recurrent layer's state is (layers * directions, N, hidden), the batch dim second: "
    "build the layer with batch_first_state=True (for a lowered torch module, "
    "`dataclasses.replace(fd.nn.lower(m), batch_first_state=True)`: the same params) to "
    "take and return it as (N, layers * directions, hidden)."
)


def _write(m: Any, data: dict, bs: torch.Size, key: Key, value: Any) -> None:
    if not isinstance(value, torch.Tensor):
        if isinstance(value, TensorDict) and value._batch_size[: len(bs)] == bs:
            pass
        else:
            raise TypeError(
                f"{m._label()}: output {E.fmt_key(key)} is a {type(value).__name__}, not a tensor. "
                "Return tensors (or a tuple of them, one per out_key)."
            )
    elif value.shape[: len(bs)] != bs:
        raise ValueError(
            f"{m._label()}: output {E.fmt_key(key)} has shape {list(value.shape)}, which does not "
            f"start with the batch size {list(bs)} of the tensordict. Keep the batch dims in front."
            + (REDUCED.format(key=E.fmt_key(key), bs=list(bs)) if value.dim() < len(bs) else "")
            + (
                RNN_STATE
                if getattr(getattr(m, "_fn", None), "batch_first_state", None) is False
                else ""
            )
        )
    if type(key) is str:
        data[key] = value
    else:
        head = data.get(key[0], _NOPE)
        if head is _NOPE:
            child = from_parts({}, bs)
        elif type(head) is TensorDict:
            child = head
        else:  # the message td.set gives: never replace the tensor by a sub-td
            raise KeyError(
                f"{m._label()}: cannot set {E.fmt_key(key)}: {E.fmt_key(key[0])} holds a "
                f"{type(head).__name__}, not a nested TensorDict. Write the output under "
                "another key."
            )
        try:
            new = set_path(child, key[1:], value, 1, check=False, prefix=(key[0],))  # type: ignore[arg-type]
        except KeyError as e:
            raise KeyError(
                f"{m._label()}: {e.args[0]} Write the output under another key."
            ) from None
        data[key[0]] = new

"""``cuda_graph(f)``: record a pure function of pytrees of tensors once, replay it after.

The wrapper keeps one recording per input *signature* (tree structure, the batch
sizes of its TensorDicts, each tensor's shape, dtype and device, and the values
of non-tensor leaves) in a small LRU cache. For each signature:

1. the first ``warmup`` calls run ``f`` eagerly on a side stream (torch's rule for
   warm-up before a capture), on the caller's tensors;
2. the next call allocates static input buffers, fills them with ``copy_`` from
   the call's inputs, records ``f`` on them into a ``torch.cuda.CUDAGraph`` and
   replays it once;
3. every later call copies its inputs into the static buffers and replays.

Outputs are cloned by default. The caller's tensors are only ever read: functd
never swaps or writes them (tensordict's ``CudaGraphModule`` swaps input leaves
during warm-up). Randomness stays random: a ``fd.random`` key is an input tensor,
copied like any other.

fd.jit's default on CUDA (``cuda_graph=None``) records with the same recorder, per
compiled signature and without a signature of its own: ``auto_graph`` puts an
:class:`EntryGraph` in place of the entry's ``outputs(ins)`` when the inputs are all on
one GPU, the shapes static (no symbolic dims), nothing donated and no input expanded;
it copies the outputs out (the graph's buffers are the next replay's), falls back to
the compiled call for good when a recording fails, and records nothing inside an outer
recording (the compiled call is recorded there). Its recordings live and die with the
jit's compiled entries (``cache_size`` of them).

Example:
    >>> step = fd.cuda_graph(train_step)   # train_step(params, batch, key) -> params
    >>> params = step(params, batch, key)  # warm-up, then record, then replay
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch

from .._td._tree import NAMESPACE
from ._jit_trace import distribution_checks_off
from ._paths import fmt_call_path
from ._signature import Flat, signature, unhashable

__all__ = ["CudaGraphWarning", "EntryGraph", "auto_graph", "cuda_graph", "signature"]

_log = logging.getLogger("functd.jit")  # fd.jit's default: which signatures are graphed


class CudaGraphWarning(UserWarning):
    """``fd.cuda_graph`` ran a function eagerly (no CUDA, or inputs on the CPU), or
    records it again because the structure of an input (a TensorDict's keys) changed."""


class CacheInfo(NamedTuple):
    """Counters of one ``cuda_graph`` wrapper (see ``step.cache_info()``)."""

    recordings: int  # graphs recorded so far (a new signature, or one evicted before)
    replays: int  # calls answered by replaying a recorded graph
    eager: int  # calls run eagerly: warm-up, or the fallback without CUDA
    size: int  # signatures held now (recorded or warming up)
    maxsize: int


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


class _CudaRecorder:
    """Warm-up and recording with torch.cuda (the real path)."""

    @staticmethod
    def available(device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available()

    @staticmethod
    def capturing(device: torch.device) -> bool:
        """Whether the current stream is being recorded (an outer CUDA graph)."""
        return torch.cuda.is_current_stream_capturing()

    @staticmethod
    def stream(device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    @staticmethod
    def wait(stream: Any, before: Any) -> None:
        """``stream`` waits for the work queued on ``before`` so far."""
        stream.wait_stream(before)

    @staticmethod
    def warm(
        f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[Any, Any], device: torch.device
    ) -> Any:
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            out = f(*args, **kwargs)
        current.wait_stream(side)
        for t in optree.tree_leaves(out, namespace=NAMESPACE):
            if _is_tensor(t) and t.device.type == "cuda":
                t.record_stream(current)  # made on `side`, used on `current`
        return out

    @staticmethod
    def record(
        f: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[Any, Any],
        device: torch.device,
        mode: str = "global",
    ):
        """Record ``f``. Distributions' argument checks are off while recording: they
        read a result on the host, which a capture forbids, and a replay could not
        check anything anyway (the warm-up calls, run eagerly, do check). A function
        that only makes views records an empty graph, which is right: torch's warning
        about it (a capture on the wrong stream) cannot apply to this recorder's.
        ``mode`` is torch's ``capture_error_mode`` ("thread_local" for fd.jit's default:
        other threads' CUDA calls are not refused while it records)."""
        graph = torch.cuda.CUDAGraph()
        with distribution_checks_off(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The CUDA Graph is empty", UserWarning)
            with torch.cuda.device(device), torch.cuda.graph(graph, capture_error_mode=mode):
                out = f(*args, **kwargs)
        return graph.replay, out


class _Entry:
    __slots__ = (
        "calls",
        "out_leaves",
        "out_spec",
        "out_tensors",
        "passthrough",
        "replay",
        "static_in",
    )
    calls: Any
    out_leaves: Any
    out_spec: Any
    out_tensors: Any
    passthrough: Any
    replay: Any
    static_in: Any

    def __init__(self) -> None:
        self.calls = 0  # warm-up calls done
        self.replay = None  # set once recorded
        self.static_in: list[torch.Tensor] = []
        self.out_leaves: list[Any] = []
        self.out_tensors: list[int] = []  # positions of tensor leaves among out_leaves
        self.passthrough: list[tuple[int, int]] = []  # (output position, input position)
        self.out_spec = None


class _Graphed:
    """The callable ``cuda_graph`` returns; ``__wrapped__``/``__doc__`` are ``f``'s."""

    def __init__(
        self,
        f: Callable[..., Any],
        warmup: int,
        clone_outputs: bool,
        cache_size: int,
        recorder: Any,
    ) -> None:
        functools.update_wrapper(self, f)
        self._f = f
        self._warmup = warmup
        self._clone = clone_outputs
        self._maxsize = cache_size
        self._recorder = recorder
        self._cache: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._memo: dict[Any, Any] = {}  # argument position -> (TensorDict, its description)
        self._warned = False
        self._specs: tuple[Any, ...] | None = None  # the tree structures of the last new signature
        self._warned_structure = False
        self._counts = [0, 0, 0]  # recordings, replays, eager
        self._label: str | None = None  # fd.jit(f, cuda_graph=True) names itself
        self._fallback = "the function runs eagerly, no graph is recorded"

    def __repr__(self) -> str:
        name = getattr(self._f, "__qualname__", repr(self._f))
        return (
            f"cuda_graph({name}, warmup={self._warmup}, clone_outputs={self._clone}, "
            f"cache_size={self._maxsize})"
        )

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # as a method decorator
        return self if obj is None else functools.partial(self, obj)

    def cache_info(self) -> CacheInfo:
        """Recordings, replays and eager calls so far, and the cache's size."""
        return CacheInfo(*self._counts, len(self._cache), self._maxsize)  # type: ignore[call-arg]

    def cache_clear(self) -> None:
        """Drop every recording (their memory is freed with them)."""
        self._cache.clear()
        self._memo.clear()

    def _name(self) -> str:
        return self._label or f"cuda_graph({getattr(self._f, '__name__', type(self._f).__name__)})"

    def _eager(self, why: str, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> Any:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self._name()}: {why}; {self._fallback}.",
                CudaGraphWarning,
                stacklevel=3,
            )
        self._counts[2] += 1
        return self._f(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = Flat(args, kwargs, self._memo)
        tensors, devices = flat.tensors, flat.devices
        if len(devices) != 1 or flat.grad:
            if not tensors:
                return self._eager("no tensor input", args, kwargs)
            self._bad_inputs(flat.grad, args, kwargs)
        sig = flat.sig
        try:
            entry = self._cache.get(sig)
        except TypeError:
            raise unhashable(self._name(), args, kwargs) from None
        if entry is not None and entry.replay is not None:  # the hot path
            self._cache.move_to_end(sig)
            _copy(entry.static_in, tensors)
            entry.replay()
            self._counts[1] += 1
            return self._outputs(entry, tensors)
        (device,) = devices
        if not self._recorder.available(device):
            why = (
                "CUDA is not available"
                if not torch.cuda.is_available()
                else f"the inputs are on {device}, not on a CUDA device"
            )
            return self._eager(why, args, kwargs)
        if entry is None:
            self._check_structure(flat, args, kwargs)
            entry = self._cache[sig] = _Entry()
            while len(self._cache) > self._maxsize:
                self._cache.popitem(last=False)  # least recently used
        else:
            self._cache.move_to_end(sig)
        if entry.calls < self._warmup:
            entry.calls += 1
            self._counts[2] += 1
            return self._recorder.warm(self._f, args, kwargs, device)
        try:
            self._record(entry, flat, args, kwargs, device)
        except BaseException:
            self._cache.pop(sig, None)
            raise
        self._counts[0] += 1
        return self._outputs(entry, tensors)

    def _check_structure(self, flat: Flat, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> None:
        """Warn once per wrapper when a new signature comes from a new tree structure
        (keys added or removed), naming the argument and the keys that changed."""
        specs = tuple(d.spec for d in flat.descs)
        old, self._specs = self._specs, specs
        if old is None or old == specs or self._warned_structure or len(old) != len(specs):
            return
        names = [f"args[{i}]" for i in range(len(args))] + [f"{k}=" for k in kwargs]
        i = next(i for i, (a, b) in enumerate(zip(old, specs)) if a != b)
        before, now = set(old[i].paths()), set(specs[i].paths())
        fmt = lambda ps: ", ".join(repr(p[0] if len(p) == 1 else p) for p in sorted(ps)) or "none"  # noqa: E731
        self._warned_structure = True
        warnings.warn(
            f"{self._name()}: the structure of {names[i]} changed (keys added: "
            f"{fmt(now - before)}; removed: {fmt(before - now)}), so it is recorded as one "
            "more graph: each distinct set of TensorDict keys is its own recording (and its "
            "own torch.compile graph). Keep the key sets fixed, e.g. pass td.select(...) of "
            "the keys the step reads. Shown once per wrapper.",
            CudaGraphWarning,
            stacklevel=3,
        )

    def _bad_inputs(self, grad: bool, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> None:
        leaves = optree.tree_leaves((args, kwargs), namespace=NAMESPACE)  # type: ignore[arg-type, var-annotated]
        paths = optree.tree_paths((args, kwargs), namespace=NAMESPACE)  # type: ignore[arg-type]
        described = [(fmt_call_path(p), v) for p, v in zip(paths, leaves) if _is_tensor(v)]
        if grad:
            bad = [p for p, v in described if v.requires_grad]
            raise ValueError(
                f"{self._name()}: input(s) {', '.join(bad[:5])} require grad. A recorded graph "
                "cannot join an outer autograd graph: compute gradients inside the function "
                "(torch.func.grad) and pass the inputs detached (`.detach()`)."
            )
        by_device: dict[Any, Any] = {}
        for p, v in described:
            by_device.setdefault(str(v.device), p)
        where = ", ".join(f"{p} on {d}" for d, p in by_device.items())
        raise ValueError(
            f"{self._name()}: the inputs are on several devices ({where}). A CUDA graph reads "
            "all its inputs on one GPU, and CPU tensors would be frozen into the recording: "
            "move every input there first (`.to('cuda')`; a TensorDict's `td.to('cuda')`)."
        )

    def _record(
        self, entry: _Entry, flat: Flat, args: tuple[Any, ...], kwargs: dict[Any, Any], device
    ) -> None:
        static_in = [torch.empty_like(t) for t in flat.tensors]  # never the caller's tensors
        _copy(static_in, flat.tensors)
        it = iter(static_in)
        sargs, skwargs = flat.rebuild(
            args, kwargs, lambda d: [next(it) if _is_tensor(v) else v for v in d.leaves]
        )
        try:
            replay, out = self._recorder.record(self._f, sargs, skwargs, device)
        except RuntimeError as e:
            raise RuntimeError(
                f"{self._name()}: recording the function into a CUDA graph failed: {e}\n"
                "A recorded function may not synchronise with the host (`.item()`, `print` "
                "of a tensor, data-dependent shapes such as `x[mask]`, CPU tensors): remove "
                "those, or run the function without fd.cuda_graph."
            ) from e
        out_leaves, out_spec = optree.tree_flatten(out, namespace=NAMESPACE)
        position = {id(t): j for j, t in enumerate(static_in)}
        entry.static_in = static_in
        entry.out_leaves = out_leaves
        entry.out_spec = out_spec
        # outputs that are inputs passed through (a td's input keys) are the caller's
        # tensors, as in eager; the others are the graph's output buffers
        entry.passthrough = [
            (i, position[id(v)]) for i, v in enumerate(out_leaves) if id(v) in position
        ]
        entry.out_tensors = [
            i for i, v in enumerate(out_leaves) if _is_tensor(v) and id(v) not in position
        ]
        entry.replay = replay
        replay()  # recording runs nothing: compute this call's outputs

    def _outputs(self, entry: _Entry, tensors: list[Any]) -> Any:
        leaves = entry.out_leaves
        if entry.passthrough or (self._clone and entry.out_tensors):
            leaves = list(leaves)
            for i, j in entry.passthrough:
                leaves[i] = tensors[j]
            if self._clone and entry.out_tensors:
                src = [leaves[i] for i in entry.out_tensors]
                if len(src) == 1:
                    dst = [src[0].clone()]
                else:
                    dst = [torch.empty_like(t) for t in src]
                    _copy(dst, src)
                for i, t in zip(entry.out_tensors, dst):
                    leaves[i] = t
        return optree.tree_unflatten(entry.out_spec, leaves)


def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    if dst:
        torch._foreach_copy_(dst, src)  # one fused launch per dtype/device group


# ---------------------------------------------------------------- fd.jit's default
def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share memory (an expanded tensor): such an input
    cannot be copied into a static buffer of the same strides."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1)
    span = 1
    for st, n in dims:
        if st < span:
            return True
        span = st * n
    return False


def _like(t: torch.Tensor) -> torch.Tensor:
    """A new tensor of ``t``'s shape, dtype and strides (strides are part of fd.jit's
    signature: an output fed back must match); contiguous where ``t`` overlaps itself."""
    if _overlaps(t):
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def why_not_graphed(tensors: list[Any], devices: set[Any]) -> str | None:
    """Why fd.jit's default records no CUDA graph for a signature with an input on a
    GPU (None: it does). The callers add the reasons they know: symbolic dims, donation."""
    if len(devices) != 1:
        return f"the inputs are on several devices ({', '.join(sorted(map(str, devices)))})"
    if any(_overlaps(t) for t in tensors):
        return "an input overlaps itself (an expanded tensor; `.contiguous()` it)"
    return None


class EntryGraph:
    """One compiled signature of ``fd.jit`` on CUDA, replayed as a CUDA graph: the
    callable that stands for the entry's ``outputs(ins)`` (flat input tensors -> the
    output tree). ``warmup`` plain calls on a side stream, then a recording on static
    copies of the inputs, then copy-in + replay + copies of the outputs. A recording
    that fails (a host sync, a CPU tensor in the code) leaves the plain compiled call
    for good; inside an outer recording the plain call is recorded there instead.

    Outputs are always fresh tensors: the graph's own output buffers are overwritten
    by the next replay, so what a call returns never changes after it. Calls are
    serialised by a lock (the static buffers are shared), and a call on another CUDA
    stream than the previous one waits for the previous one's work first.

    Example:
        >>> outputs = EntryGraph(entry.outputs, torch.device("cuda"), _CudaRecorder, "f")
        >>> out = outputs(ins)  # warm-up, warm-up, record, then replays
    """

    def __init__(
        self,
        run: Callable[[list[Any]], Any],
        device: torch.device,
        recorder: Any,
        name: str,
        warmup: int = 2,
    ) -> None:
        self.run, self.device, self.recorder, self.name = run, device, recorder, name
        self.warmup, self.calls = warmup, 0
        self.replay: Callable[[], Any] | None = None
        self.failed: str | None = None
        self.static_in: list[torch.Tensor] = []
        self.out_leaves: list[Any] = []
        self.out_spec: Any = None
        self.passthrough: list[tuple[int, int]] = []  # (output position, input position)
        self.computed: list[tuple[int, int]] = []  # (output position, index in srcs)
        self.srcs: list[torch.Tensor] = []  # the graph's output buffers, each once
        self.last_stream: Any = None
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        state = (
            f"not graphed: {self.failed}"
            if self.failed
            else "graphed"
            if self.replay is not None
            else f"warm-up {self.calls}/{self.warmup}"
        )
        return f"EntryGraph({self.name}, {self.device}, {state})"

    def __call__(self, ins: list[Any]) -> Any:
        rec = self.recorder
        if self.failed is not None or rec.capturing(self.device):
            return self.run(ins)
        with self.lock:
            stream = rec.stream(self.device)
            if stream != self.last_stream:
                if self.last_stream is not None:  # its copies and replay may still run
                    rec.wait(stream, self.last_stream)
                self.last_stream = stream
            if self.replay is not None:
                _copy(self.static_in, ins)
                self.replay()
            elif self.calls < self.warmup:
                self.calls += 1
                return rec.warm(self.run, (ins,), {}, self.device)
            elif not self._record(ins):
                return self.run(ins)
            return self._outputs(ins)

    def _record(self, ins: list[Any]) -> bool:
        """Record on static copies of ``ins``; False when the recording failed. The
        buffers are normal tensors even under ``torch.inference_mode`` (a later call
        outside it copies into them)."""
        try:
            with torch.inference_mode(False):
                static_in = [_like(t) for t in ins]  # (no input overlaps itself)
                _copy(static_in, ins)
                replay, out = self.recorder.record(
                    self.run, (static_in,), {}, self.device, "thread_local"
                )
        except Exception as e:  # a capture error: the plain compiled call from now on
            self.failed = f"recording failed ({type(e).__name__}: {str(e).strip()[:200]})"
            _log.debug("%s: a signature runs without a CUDA graph: %s", self.name, self.failed)
            return False
        leaves, self.out_spec = optree.tree_flatten(out, namespace=NAMESPACE)
        position = {id(t): j for j, t in enumerate(static_in)}
        index: dict[int, int] = {}
        for i, v in enumerate(leaves):
            if id(v) in position:
                self.passthrough.append((i, position[id(v)]))
            elif _is_tensor(v):
                k = index.setdefault(id(v), len(self.srcs))
                if k == len(self.srcs):
                    self.srcs.append(v)
                self.computed.append((i, k))
        self.static_in, self.out_leaves, self.replay = static_in, leaves, replay
        _log.debug("%s: a signature is recorded as a CUDA graph on %s", self.name, self.device)
        replay()  # recording runs nothing: compute this call's outputs
        return True

    def _outputs(self, ins: list[Any]) -> Any:
        leaves = list(self.out_leaves)
        for i, j in self.passthrough:
            leaves[i] = ins[j]
        if self.srcs:
            dst = [_like(t) for t in self.srcs]
            _copy(dst, self.srcs)
            for i, k in self.computed:
                leaves[i] = dst[k]
        return optree.tree_unflatten(self.out_spec, leaves)


def auto_graph(
    run: Callable[[list[Any]], Any],
    flat: Flat,
    dyn: Any,
    donated: Any,
    recorder: Any,
    name: str,
) -> Callable[[list[Any]], Any]:
    """fd.jit's ``cuda_graph=None`` for one compiled entry: ``run`` (its ``outputs``)
    as an :class:`EntryGraph` when the signature of ``flat`` can be recorded, else
    ``run`` itself; a debug line of the ``functd.jit`` logger says which. ``dyn``: the
    entry's symbolic dims (None: static shapes); ``donated``: its donated outputs.
    Without any input on a GPU there is nothing to record, and nothing is logged."""
    if not any(recorder.available(d) for d in flat.devices):
        return run
    why = "symbolic dims" if dyn else "donated inputs" if donated else None
    why = why or why_not_graphed(flat.tensors, flat.devices)
    if why is not None:
        _log.debug("%s: a signature runs without a CUDA graph: %s", name, why)
        return run
    (device,) = flat.devices
    _log.debug("%s: a signature will be recorded as a CUDA graph on %s", name, device)
    return EntryGraph(run, device, recorder, name)


def cuda_graph(
    f: Callable[..., Any] | None = None,
    *,
    warmup: int = 2,
    clone_outputs: bool = True,
    cache_size: int = 8,
) -> Any:
    """Record ``f`` into a CUDA graph after ``warmup`` calls, and replay it afterwards.

    ``f`` is a pure function of pytrees of tensors (TensorDicts, tuples, dicts of
    tensors; e.g. a whole training step returning new params). Each new input
    signature (see :func:`signature`) gets its own warm-up and recording; an LRU
    cache keeps ``cache_size`` of them. A new signature during warm-up simply
    starts a warm-up of its own. The caller's tensors are read, never written.

    Without CUDA (or with every input on the CPU) ``f`` runs eagerly, and a
    :class:`CudaGraphWarning` says so once per wrapper. While it records, torch
    distributions do not check their arguments (a check reads a result on the
    host, which a recording forbids); the warm-up calls check them.

    Args:
        f: the function; ``cuda_graph(warmup=3)`` without ``f`` gives a decorator.
        warmup: eager calls per signature before recording (on a side stream).
        clone_outputs: return copies of the outputs (default). With False the
            outputs *are* the graph's static buffers: the next call with the
            same signature overwrites them, so clone what you keep.
        cache_size: how many signatures' recordings to keep (least recently used
            dropped first; a dropped one is warmed up and recorded again).

    Returns:
        A callable with ``f``'s ``__wrapped__``, ``__doc__`` and name, and
        ``cache_info()`` / ``cache_clear()``.

    Raises:
        ValueError: an input requires grad, or inputs mix devices (CPU and CUDA).
        TypeError: a non-tensor input is not hashable.
        RuntimeError: ``f`` cannot be recorded (it synchronises with the host).

    Example:
        >>> step = fd.cuda_graph(lambda p, td: block(p, td), warmup=2)
        >>> out = step(params, td.to("cuda"))
        >>> step.cache_info().recordings
    """
    if f is None:
        return functools.partial(
            cuda_graph, warmup=warmup, clone_outputs=clone_outputs, cache_size=cache_size
        )
    if not callable(f):
        raise TypeError(f"cuda_graph(f) takes a function, got {type(f).__name__}.")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"cuda_graph: warmup must be an int >= 0, got {warmup!r}.")
    if not isinstance(cache_size, int) or cache_size < 1:
        raise ValueError(f"cuda_graph: cache_size must be an int >= 1, got {cache_size!r}.")
    return _Graphed(f, warmup, bool(clone_outputs), cache_size, _CudaRecorder())

"""``fd.jit(f)``: compile a pure function of pytrees once per signature, call it directly.

The first call per *signature* (see ``_signature``: tree structure, batch sizes,
per tensor shape, dtype and strides, devices, non-tensor leaves, and the ambient
interaction type and autocast state) traces ``f`` on tensors without values and
compiles the trace with inductor (``_jit_trace``). A signature that differs from a
compiled one only in some sizes (a new batch size) compiles once more with those
dims symbolic, and that code then serves every size its shape guards accept.

A call of the latest signature runs two functions generated for it
(``_jit_code``): an argument check (identity for a TensorDict passed again, else
its layout; its leaves' metadata in one C call) and the compiled code followed by
the output tree, built directly: no dynamo frame, no guard evaluation, no
AOTAutograd wrapper, no pytree walk. Any other call flattens its arguments
(``Flat``), looks the signature up in a dict and runs the same functions.

Threads: calls of compiled signatures take no lock. A miss takes the wrapper's lock
(threads making the same first call at once compile once: the others wait, then find
the entry), and the trace and compile take one process-wide lock (``make_fx``
patches module-level state and inductor's config is global: two traces at once
break each other). While a thread traces, torch's "compiling" flag is set for the
whole process: a jitted function called in *that* thread inlines, in any other
thread it runs as usual.

Warm starts (``_jit_disk``): inductor's FX graph cache on disk (``TORCHINDUCTOR_CACHE_DIR``)
serves a second process compiling the same function and signature; ``cache_info().from_disk``
and ``lower(...).from_disk`` say so. A directory group or others can write is not used
(one JitWarning). The compile log (``_jit_log``): a compile over 2 s logs its start and
end at INFO on ``logging.getLogger("functd")`` (a NullHandler; no level set by functd).

Example:
    >>> jstep = fd.jit(fd.train_step(loss, fd.optim.adam(1e-3)))
    >>> params, opt_state, metrics = jstep(params, opt_state, batch, key)
    >>> jstep.cache_size()
    1
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar, overload

import optree
import torch

from .._ambient import INTERACTION, snapshot
from .._td import TensorDict
from .._td._tree import NAMESPACE
from .._torch.functorch import peek_interpreter_stack
from .._torch.ops import any_autocast
from ._cuda_graph import _CudaRecorder, _Graphed, auto_graph
from ._jit_artifact import Compiled, Lowered, build
from ._jit_code import make_match, make_outputs
from ._jit_disk import disk_cache
from ._jit_log import CompileLog, describe
from ._jit_options import checked
from ._jit_trace import Static, compile_graph, trace
from ._signature import Flat, describe_change, skeleton, unhashable
from ._vmap import TransformError

__all__ = ["CacheInfo", "JitWarning", "Lowered", "compiles", "jit"]

_MAX_ALIASES = 256  # signatures remembered (each points to a compiled entry)
_MAX_DERIVED = 16  # transforms of one wrapper kept (fd.grad(jf), fd.vmap(jf)...: _compose)
_COUNT = [0]  # compilations by every fd.jit wrapper (functd.testing reads it)
_peek = peek_interpreter_stack
_is_dynamo = torch.compiler.is_dynamo_compiling  # folded to True by dynamo
_compiler = torch.compiler  # ._is_compiling_flag: True in torch.export's and fd.jit's traces
_any_autocast = any_autocast
_TRACE_LOCK = threading.RLock()  # one trace + compile at a time in the process
_TRACING: list[int | None] = [None]  # the thread whose fd.jit trace is under way
_get_ident = threading.get_ident
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _inline() -> bool:
    """Whether a call made while torch's compiling flag is set runs ``f`` itself:
    inside torch.compile/torch.export, or inside this thread's fd.jit trace (the flag
    is process-wide: another thread's trace sets it too)."""
    owner = _TRACING[0]
    return owner is None or owner == _get_ident()


GRAD_INPUTS = (
    "{name}: input(s) {paths} require grad. A jitted function returns tensors without "
    "autograd history, so nothing would flow back to them. Differentiate inside the "
    "compiled function: fd.jit(fd.grad(loss)) or fd.jit(fd.value_and_grad(loss)) (a whole "
    "step: fd.jit(fd.train_step(loss, opt))); or pass the inputs detached (`.detach()`)."
)
UNDER_TRANSFORM = (
    "{name} was called inside {transform}: compiled code runs on plain tensors, which "
    "torch.func cannot trace through, so f runs here uncompiled under the transform (the "
    "same values). To compile the transform, apply it to the jitted function, as in JAX: "
    "{fix} is fd.jit of the transform, compiled once per signature. Shown once per wrapper."
)
_FIXES = {
    "Vmap": ("fd.vmap / torch.func.vmap", "fd.vmap(jitted)"),
    "Grad": ("fd.grad / torch.func.grad (or vjp, jacrev)", "fd.grad(jitted)"),
    "Jvp": ("fd.jvp / torch.func.jvp (or jacfwd)", "fd.jvp(jitted, primals, tangents)"),
    "Functionalize": ("torch.func.functionalize", "jitted itself"),
}


class JitWarning(UserWarning):
    """``fd.jit`` compiled more signatures than its ``cache_size`` (the warning names
    what changed between the last two)."""


class CacheInfo(NamedTuple):
    """Counters of one ``fd.jit`` wrapper (see ``jstep.cache_info()``)."""

    compiles: int  # traces + compilations so far
    calls: int  # calls answered by compiled code (the first call of a signature too)
    size: int  # compiled entries held now
    maxsize: int
    from_disk: int = 0  # compiles answered by inductor's cache on disk (a warm start)


def _plain(v: Any) -> bool:
    """Whether ``v`` is made of tuples, ints, floats, strings, bools and None only."""
    if type(v) is tuple:
        return all(_plain(w) for w in v)
    return v is None or type(v) in (int, float, str, bool)


def compiles() -> int:
    """How many traces + compilations every ``fd.jit`` wrapper made so far."""
    return _COUNT[0]


class _Entry:
    """One compiled signature: the code and how to rebuild the output tree."""

    __slots__ = (
        "aliases", "donated", "dyn", "from_disk", "graph", "guards", "out_computed",
        "out_leaves", "out_spec", "outputs", "passthrough", "run", "shapes", "source", "struct",
    )  # fmt: skip
    aliases: Any
    donated: Any
    dyn: Any
    from_disk: Any
    graph: Any
    guards: Any
    out_computed: Any
    out_leaves: Any
    out_spec: Any
    outputs: Any
    passthrough: Any
    run: Any
    shapes: Any
    source: Any
    struct: Any

    def accepts(self, tensors: list) -> bool:
        """Whether a new signature of this structure passes the shape guards."""
        if self.guards is None:
            return self.dyn is not None  # symbolic dims without any guard
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

        names = {f"t{i}": t for i, t in enumerate(tensors)}
        return bool(eval(self.guards, SYMPY_INTERP, {"L": names}))  # torch's guard code


def _structure(flat: Flat, ambient: tuple) -> tuple:
    """A signature without sizes and strides: what a symbolic dim cannot change."""
    return (ambient, flat.sig[0], flat.sig[1], *[skeleton(d) for d in flat.descs])


def _batch_dims(flat: Flat) -> list[tuple[int, tuple]]:
    """Per tensor leaf of the call: (its argument's position, the batch dims of the
    TensorDict argument it is in; none for tensors outside TensorDicts). A nested
    TensorDict's leaves take the batch dims of the TensorDict at the root."""
    out: list[tuple[int, tuple]] = []
    for i, d in enumerate(flat.descs):
        if d.kind == "td":
            dims = tuple(range(len(d.value.batch_size)))
            out += [(i, dims)] * len(d.tensors)
        elif d.kind == "tensor":
            out.append((i, ()))
        else:
            for v in optree.tree_leaves(
                d.value, is_leaf=lambda x: type(x) is TensorDict, namespace=NAMESPACE
            ):
                if type(v) is TensorDict:
                    n = len(Flat((v,), {}, {}).tensors)
                    out += [(i, tuple(range(len(v.batch_size))))] * n
                elif isinstance(v, torch.Tensor):
                    out.append((i, ()))
    return out


class _Jitted(Generic[_P, _R]):
    """The callable ``jit`` returns; ``__wrapped__``/``__doc__`` are ``f``'s."""

    def __init__(
        self,
        f: Callable[_P, _R],
        static: tuple[int, ...],
        donate: tuple[int, ...],
        dynamic: bool | None,
        cache_size: int,
        backend: str,
        cuda_graph: bool | None = None,
    ) -> None:
        functools.update_wrapper(self, f)
        self._f, self._static, self._donate, self._recorder = f, static, donate, _CudaRecorder
        self._opts = (dynamic, cache_size, backend, cuda_graph)  # (_fd_jit_derive's)
        self._dynamic, self._maxsize, self._backend, self._cuda_graph = self._opts
        self._memo: dict = {}  # argument position -> (TensorDict, its description)
        self._aliases: dict = {}  # signature -> entry
        self._lru: OrderedDict[_Entry, None] = OrderedDict()  # compiled entries
        self._by_struct: dict[tuple, list[_Entry]] = {}
        self._last_sig: tuple | None = None
        self._warned = False
        self._counts = [0, 0, 0]  # compiles, calls, compiled entries loaded from disk
        self._graphed: _Graphed | None = None
        self._fast: tuple | None = None  # the latest signature, checked without a key
        self._varying: set[int] = set()  # arguments whose batch size was seen to change
        self._derived: OrderedDict[Any, _Jitted] = OrderedDict()  # fd.grad(self)... (_compose)
        self._label: str | None = None  # e.g. "grad(loss)" for the jit of fd.grad(jit(loss))
        self._under_warned = False
        self._lock = threading.RLock()  # held by a miss: one compile per signature

    # ------------------------------------------------------------ the public surface
    def __repr__(self) -> str:
        opts = [f"backend={self._backend!r}"]
        if self._static:
            opts.append(f"static_argnums={self._static}")
        if self._donate:
            opts.append(f"donate_argnums={self._donate}")
        if self._dynamic is not None:
            opts.append(f"dynamic={self._dynamic}")
        if self._cuda_graph is not None:
            opts.append(f"cuda_graph={self._cuda_graph}")
        return f"jit({self._fname()}, {', '.join(opts)}, cache_size={self._maxsize})"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # as a method decorator
        return self if obj is None else functools.partial(self, obj)

    def cache_size(self) -> int:
        """How many compiled signatures this wrapper holds now."""
        return len(self._lru)

    def cache_info(self) -> CacheInfo:
        """Compilations and calls so far, the cache's size, and how many of the
        compilations loaded their code from inductor's cache on disk."""
        c = self._counts
        return CacheInfo(c[0], c[1], len(self._lru), self._maxsize, c[2])

    def cache_clear(self) -> None:
        """Drop every compiled signature (and CUDA graph recording)."""
        with self._lock:
            self._fast = None
            self._aliases.clear()
            self._lru.clear()
            self._by_struct.clear()
            self._memo.clear()
            self._varying.clear()
            self._derived.clear()
        if self._graphed is not None:
            self._graphed.cache_clear()

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """The traced graph and the compiled code for the signature of ``args``
        (compiled now when it is not cached yet; a later call of it is then free);
        ``.save(path)`` writes an artifact that ``fd.load_compiled(path)`` runs.

        Example:
            >>> fd.jit(block).lower(params, td).save("block.pt2")
        """
        args = self._wrap_static(args)
        flat = Flat(args, kwargs, {})
        with self._lock:
            entry = self._entry(flat, args, kwargs)
        sig, name = describe(flat), self._name()

        def aot() -> Compiled:  # Lowered.compile(): traced again, static, nothing donated
            with _TRACE_LOCK:
                outer, _TRACING[0] = _TRACING[0], _get_ident()
                try:
                    traced = trace(self._f, name, flat, args, kwargs, None, frozenset())
                    return build(name, sig, flat, traced)
                finally:
                    _TRACING[0] = outer

        dyn = entry.dyn or ()
        return Lowered(sig, dyn, entry.graph, entry.source, aot, from_disk=entry.from_disk)

    # ------------------------------------------------------------ calls
    def _fname(self) -> str:
        if self._label is not None:
            return self._label
        return getattr(self._f, "__name__", None) or type(self._f).__name__

    def _name(self) -> str:
        return f"fd.jit({self._fname()})"

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if _is_dynamo() or (_compiler._is_compiling_flag and _inline()):
            # inside torch.compile, torch.export or an outer fd.jit trace: f is traced there
            return self._f(*args, **kwargs)
        fast = self._fast  # (entry, match, interaction) of the latest signature
        if fast is not None and _peek() is None and not _any_autocast():
            ins = fast[1](args, kwargs)
            if ins is not None and INTERACTION.value is fast[2]:
                self._counts[1] += 1
                return fast[0].outputs(ins)
        return self._slow(args, kwargs)

    def _slow(self, args: tuple, kwargs: dict) -> Any:
        if _peek() is not None:  # under a torch.func transform: f itself, uncompiled
            return self._under_transform(args, kwargs)
        if self._static:
            args = self._wrap_static(args)
        flat = Flat(args, kwargs, self._memo)
        if flat.grad:
            self._refuse(flat)
        ambient = snapshot()
        key = (flat.sig, ambient)
        try:
            hit = self._aliases.get(key)
        except TypeError:
            raise unhashable(self._name(), args, kwargs) from None
        if hit is None:
            with self._lock:  # another thread making this call waits, then finds it
                entry = self._entry(flat, args, kwargs)
                hit = self._aliases[key]
        else:
            entry = hit[0]
            try:  # noqa: SIM105 (suppress() costs a context manager per call)
                self._lru.move_to_end(entry)
            except KeyError:  # another thread's compile dropped it meanwhile
                pass
        self._counts[1] += 1
        ins = flat.tensors
        if entry.donated:
            self._check_donation(entry, ins)
        elif not self._static and ambient[1] is False and not flat.grad:
            if hit[1] is None:  # generated once per signature
                hit[1] = make_match(flat, self._memo)
            self._fast = (entry, hit[1], ambient[0])
        return entry.outputs(ins)

    def _wrap_static(self, args: tuple) -> tuple:
        if not self._static:
            return args
        out = list(args)
        for i in self._static:
            if i >= len(args):
                raise TypeError(
                    f"{self._name()}: static_argnums={self._static} names argument {i}, but "
                    f"the call has {len(args)} positional argument(s)."
                )
            try:
                out[i] = Static(args[i])
            except TypeError:
                raise TypeError(
                    f"{self._name()}: the static argument args[{i}] (a "
                    f"{type(args[i]).__name__}) is not hashable; a static argument is part "
                    "of the signature the compiled code is cached under. Pass a hashable "
                    "value (a tuple rather than a list), or make it a traced argument."
                ) from None
        return tuple(out)

    def _under_transform(self, args: tuple, kwargs: dict) -> Any:
        """A call inside a torch.func transform (``fd.grad(lambda p: jf(p) * 2)``,
        ``torch.func.vmap(jf)``): ``f`` runs under it, as its inlined trace would (one
        warning per wrapper says how to get it compiled)."""
        if not self._under_warned:
            self._under_warned = True
            level = _peek()
            kind = str(level.key()).rpartition(".")[2]
            transform, fix = _FIXES.get(kind, (f"a torch.func transform ({kind})", "jitted"))
            warnings.warn(
                UNDER_TRANSFORM.format(name=self._name(), transform=transform, fix=fix),
                JitWarning,
                stacklevel=4,
            )
        return self._f(*args, **kwargs)

    def _fd_jit_derive(
        self, key: tuple, build: Callable[[Callable], Callable], static: bool = True
    ) -> _Jitted:
        """``fd.jit(build(f))`` with this wrapper's options (nothing donated; the static
        argument numbers only with ``static``), kept under ``key`` (the transform's name
        and options, see ``_compose``) when it holds only plain values."""
        cached = key if _plain(key) else None
        with self._lock:
            hit = None if cached is None else self._derived.get(cached)
            if hit is not None:
                self._derived.move_to_end(cached)
                return hit
            nums = self._static if static else ()
            out = type(self)(build(self._f), nums, (), *self._opts)
            out._label = f"{key[0]}({self._fname()})"
            if cached is not None:
                self._derived[cached] = out
                if len(self._derived) > _MAX_DERIVED:
                    self._derived.popitem(last=False)
            return out

    def _refuse(self, flat: Flat) -> None:
        if torch.is_grad_enabled():
            paths = [p for p, t in zip(flat.paths(), flat.tensors) if t.requires_grad]
            raise TransformError(GRAD_INPUTS.format(name=self._name(), paths=", ".join(paths[:5])))

    # ------------------------------------------------------------ misses
    def _entry(self, flat: Flat, args: tuple, kwargs: dict) -> _Entry:
        """The compiled entry for a signature not seen yet: a symbolic entry of the same
        structure whose guards accept it, or a new compilation. The caller holds
        ``self._lock``."""
        ambient = snapshot()
        key = (flat.sig, ambient)
        try:
            hit = self._aliases.get(key)
        except TypeError:
            raise unhashable(self._name(), args, kwargs) from None
        if hit is not None:
            return hit[0]
        struct = _structure(flat, ambient)
        family = self._by_struct.setdefault(struct, [])
        entry = next(
            (e for e in reversed(family) if e.dyn is not None and e.accepts(flat.tensors)), None
        )
        if entry is None:
            entry = self._compile(flat, args, kwargs, struct, family)
        if len(self._aliases) >= _MAX_ALIASES:
            old = next(iter(self._aliases))
            self._aliases.pop(old)[0].aliases.discard(old)
        self._aliases[key] = [entry, None]  # [entry, its argument check once generated]
        entry.aliases.add(key)
        self._lru[entry] = None
        self._lru.move_to_end(entry)
        return entry

    def _dyn_dims(self, flat: Flat, family: list) -> tuple | None:
        """Per input tensor, the dims to make symbolic (None: a static compilation):
        with ``dynamic=None``, the dims that changed since the latest entry of this
        structure, and the batch dims of the arguments whose batch size was seen to
        change (also in another structure: a new key set compiles once, symbolic);
        with ``dynamic=True`` every TensorDict argument's batch dims."""
        if self._dynamic is False:
            return None
        shapes = [tuple(t.shape) for t in flat.tensors]
        dims = [set() for _ in shapes]  # type: ignore[var-annotated]
        batch = _batch_dims(flat)
        if family:
            ref = family[-1]
            olds = ref.dyn or [()] * len(shapes)
            for s, now, before, old, (arg, b) in zip(dims, shapes, ref.shapes, olds, batch):
                s.update(d for d in range(len(now)) if now[d] != before[d])
                s.update(old)
                if s & set(b):
                    self._varying.add(arg)
        for s, (arg, b) in zip(dims, batch):
            if self._dynamic is True or arg in self._varying:
                s.update(b)
        if not any(dims):
            return None
        return tuple(tuple(sorted(s)) for s in dims)

    def _compile(
        self, flat: Flat, args: tuple, kwargs: dict, struct: tuple, family: list
    ) -> _Entry:
        dyn = self._dyn_dims(flat, family)
        donated = frozenset(self._donated_inputs(flat))
        with _TRACE_LOCK, CompileLog(self._name(), lambda: describe(flat)) as log:
            outer, _TRACING[0] = _TRACING[0], _get_ident()
            try:
                traced, graph, run, source = self._build(flat, args, kwargs, dyn, donated, log)
            finally:
                _TRACING[0] = outer
            _COUNT[0] += 1
        self._counts[0] += 1
        self._counts[2] += log.from_disk
        e = _Entry()
        e.run, e.source, e.graph, e.from_disk = run, source, graph, log.from_disk
        e.out_spec, e.out_leaves = traced.out_spec, traced.out_leaves
        sources = [f"K[{i}]" for i in range(len(traced.out_leaves))]
        for k, i in enumerate(traced.out_computed):
            sources[i] = f"c[{k}]"
        for i, j in (*traced.passthrough, *traced.donated):
            sources[i] = f"ins[{j}]"
        e.outputs = make_outputs(traced.out, traced.out_spec, sources, traced.out_leaves, run)
        if self._cuda_graph is None:  # CUDA graphs by default, where they can record
            rec, name = self._recorder, self._name()
            e.outputs = auto_graph(e.outputs, flat, dyn, traced.donated, rec, name)
        e.out_computed, e.passthrough, e.donated = (
            traced.out_computed,
            traced.passthrough,
            traced.donated,
        )
        e.dyn = dyn
        e.guards = None if traced.guards is None else compile(traced.guards, "<guards>", "eval")
        e.shapes = [tuple(t.shape) for t in flat.tensors]
        e.struct = struct
        e.aliases = set()
        family.append(e)
        self._evict(flat)
        return e

    def _build(self, flat: Flat, args: tuple, kwargs: dict, dyn: Any, donated: Any, log: Any):
        """(traced, its graph's code, run, source): the trace and the compile, the
        compiled code possibly from inductor's cache on disk (``log.from_disk``)."""
        name, on_disk = self._name(), self._backend == "inductor"
        traced = trace(self._f, name, flat, args, kwargs, dyn, donated)
        graph = traced.gm.code  # as traced (inductor rewrites the module it compiles)
        log.checkpoint()
        try:
            with disk_cache(name, JitWarning, on_disk) as disk:
                run, source = compile_graph(traced, self._backend)
        except Exception as err:
            if "higher_order.scan" not in graph:
                raise
            from ._loops_hop import loops_unrolled  # a loop inductor cannot compile

            with loops_unrolled(err):
                traced = trace(self._f, name, flat, args, kwargs, dyn, donated)
            graph = traced.gm.code
            with disk_cache(name, JitWarning, on_disk) as disk:
                run, source = compile_graph(traced, self._backend)
        log.from_disk = disk.hit
        return traced, graph, run, source

    def _evict(self, flat: Flat) -> None:
        """Keep ``cache_size`` entries (least recently used out); warn once past it."""
        last, self._last_sig = self._last_sig, flat.sig
        if len(self._lru) < self._maxsize:
            return
        old, _ = self._lru.popitem(last=False)
        for k in old.aliases:
            self._aliases.pop(k, None)
        if self._fast is not None and self._fast[0] is old:
            self._fast = None
        family = self._by_struct.get(old.struct, [])
        if old in family:
            family.remove(old)
        if not self._warned and last is not None:
            self._warned = True
            warnings.warn(
                f"{self._name()}: compiled {self._counts[0]} signatures, more than "
                f"cache_size={self._maxsize}; the least recently used one is dropped (it "
                f"compiles again when called). The latest change: "
                f"{describe_change(last, flat.sig)}. Each distinct key set, dtype, static "
                "value or non-batch shape is its own compilation: keep them fixed (e.g. "
                "td.select(...) the keys the function reads), or raise cache_size. Shown "
                "once per wrapper.",
                JitWarning,
                stacklevel=5,
            )

    # ------------------------------------------------------------ donation
    def _donated_inputs(self, flat: Flat) -> list[int]:
        out, i = [], 0  # type: ignore[var-annotated]
        for pos, d in enumerate(flat.descs):
            n = len(d.tensors)
            if pos in self._donate:
                out.extend(range(i, i + n))
            i += n
        return out

    def _check_donation(self, entry: _Entry, ins: list) -> None:
        ptrs = [t.untyped_storage().data_ptr() for t in ins]
        donors = [ptrs[j] for _, j in entry.donated if ptrs[j]]  # (0: an empty tensor)
        if any(ptrs.count(p) > 1 for p in donors):
            raise ValueError(
                f"{self._name()}: a donated input shares its memory with another input; "
                "donation writes the output into it, which would change the other input "
                "while the function reads it. Pass separate tensors (`.clone()`) or do not "
                "donate that argument."
            )


class _GraphedJit(_Jitted):
    """``jit(f, cuda_graph=True)``: ``fd.cuda_graph``'s wrapper around the jitted call
    (it warms up, records and replays the compiled code per signature)."""

    def __init__(self, *args: Any) -> None:  # _Jitted's arguments
        super().__init__(*args)
        call = functools.partial(_Jitted.__call__, self)
        g = _Graphed(call, 2, True, self._maxsize, _CudaRecorder())
        g._label = f"jit({self._fname()}, cuda_graph=True)"
        g._fallback = "the compiled function runs without a CUDA graph"
        self._graphed = g

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_dynamo() or (_compiler._is_compiling_flag and _inline()):
            return self._f(*args, **kwargs)
        if _peek() is not None:
            return self._under_transform(args, kwargs)
        return self._graphed(*args, **kwargs)  # type: ignore[misc]


@overload
def jit(
    f: Callable[_P, _R],
    *,
    static_argnums: int | Sequence[int] = (),
    donate_argnums: int | Sequence[int] = (),
    dynamic: bool | None = None,
    cache_size: int = 8,
    backend: str = "inductor",
    cuda_graph: bool | None = None,
) -> _Jitted[_P, _R]: ...
@overload  # the decorator form, fd.jit(static_argnums=1): jit's keywords
def jit(f: None = None, **options: Any) -> Callable[[Callable[_P, _R]], _Jitted[_P, _R]]: ...


def jit(  # type: ignore[misc]  # overload 2 spells jit's keywords as **options
    f: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    donate_argnums: int | Sequence[int] = (),
    dynamic: bool | None = None,
    cache_size: int = 8,
    backend: str = "inductor",
    cuda_graph: bool | None = None,
) -> Any:
    """Compile ``f``, a pure function of pytrees, once per input signature.

    The first call with a new signature traces ``f`` on tensors without values (``make_fx``: any
    ``fd.grad``/``fd.vmap`` inside is part of the trace) and compiles the graph with inductor;
    later calls of that signature check it with one dict lookup and run the compiled code
    directly (no dynamo frame, no guards; on CUDA a CUDA graph: see ``cuda_graph``). A new batch
    size compiles once more with the batch dims symbolic; after that no new batch size compiles.
    Keys (``fd.random``) are inputs like any tensor: each call draws anew.

    The signature of a call: per argument its tree structure (TensorDict keys), batch sizes,
    per tensor shape, dtype, strides and device, its non-tensor leaves (static: compared by
    value, so hashable), and the ambient ``fd.set_interaction_type`` and autocast state.

    Rules: ``f`` is pure. Branching in Python on a tensor's value, a write into an
    input or into a closed-over tensor, or a draw from torch's global generator
    raise a :class:`TransformError` at the first call, never a silent eager run.
    Outputs that are inputs passed through are the caller's tensors (as in eager);
    other outputs are new tensors, never an input's memory unless it was donated.
    Outputs have no autograd history: differentiate with functd's transforms, in
    either order as in JAX: ``fd.grad(fd.jit(f))`` is ``fd.jit(fd.grad(f))`` (so are
    ``fd.vmap``, ``fd.jvp``, ``fd.vjp``, ``fd.jacrev``, ``fd.jacfwd``, ``fd.hessian``;
    compiled, and kept on the jitted function). Called inside a torch.func transform,
    the jitted function runs ``f`` uncompiled there (one :class:`JitWarning`).

    Args:
        f: the function; ``fd.jit(static_argnums=1)`` without ``f`` is a decorator.
        static_argnums: positional arguments that are compile-time constants
            (hashable; compared by value; a new value compiles again).
        donate_argnums: positional arguments whose tensors may hold outputs of the
            same shape, dtype and strides: the compiled code writes the outputs into
            them (no allocation; e.g. params and optimizer state of a step). Do not
            read a donated argument after the call.
        dynamic: None (default): dims that change between calls of one structure
            become symbolic at the second compile; True: the batch dims of every
            TensorDict argument are symbolic from the first; False: never symbolic.
        cache_size: compiled signatures kept (least recently used dropped); past it a
            :class:`JitWarning` names what changed, once per wrapper.
        backend: "inductor" (compiled code; its C++ wrapper on the CPU) or "fx" (the
            traced graph run as it is: for tests and debugging).
        cuda_graph: None (default): a signature with its inputs on one GPU, static shapes,
            nothing donated, records a CUDA graph at its 3rd call and replays it (outputs
            copied out: later calls never overwrite them); others, and failed recordings
            (host syncs), run compiled code (debug lines of the ``functd.jit`` logger).
            False: never. True: ``fd.cuda_graph``'s wrapper, its errors and warnings.

    Returns:
        A callable with ``f``'s name and doc, ``cache_size()``, ``cache_info()``
        (``from_disk``: compiles loaded from inductor's disk cache), ``cache_clear()``,
        ``lower(*args)``. A compile over 2 s logs at INFO on the "functd" logger.

    Raises:
        TransformError: ``f`` cannot be traced purely (see Rules), or is called
            with inputs that require grad outside a transform (use ``fd.grad``).
        TypeError: a non-tensor input or a static argument is not hashable; an
            output leaf is neither a tensor nor a plain Python value.

    Example:
        >>> jblock = fd.jit(block)
        >>> out = jblock(params, fd.TensorDict({"x": x}, [1]))   # compiles
        >>> out = jblock(params, fd.TensorDict({"x": x2}, [1]))  # runs the compiled code
        >>> jblock.cache_size()
        1
    """
    kw: dict[str, Any] = {"static_argnums": static_argnums, "donate_argnums": donate_argnums}
    kw.update(dynamic=dynamic, cache_size=cache_size, backend=backend, cuda_graph=cuda_graph)
    if f is None:
        return functools.partial(jit, **kw)
    static, donate = checked(f, static_argnums, donate_argnums, dynamic, cache_size, backend)
    cls = _GraphedJit if cuda_graph else _Jitted
    return cls(f, static, donate, dynamic, cache_size, backend, cuda_graph)

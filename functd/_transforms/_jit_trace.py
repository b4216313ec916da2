"""The trace and the compile behind ``fd.jit``: one per signature.

``trace`` runs ``f`` once on fake tensors (shapes, no values) under
``make_fx(functionalize(...))`` with inductor's decompositions, the way
``torch.export``'s non-strict mode does: ``torch.compiler.is_compiling()`` is
True meanwhile, so functd takes the paths it takes under ``torch.compile``, and
torch.distributions' argument checks (host syncs) are off, as torch.compile turns
them off. The dims a signature change showed to vary are symbolic (a ShapeEnv
symbol each), every other dim is static. Operands an op refuses (the ops eager runs on
one dtype only, checked as they are traced; any op whose shape, dtype or device check
fails) raise an error naming the op, the operands and the argument paths they come
from (``_refused``). The FX graph is then checked (no write into an input or into a
tensor ``f`` closes over, no draw from torch's global generator), the outputs that are inputs passed through are taken out of it, and
``compile_graph`` hands it to inductor (``compile_fx_inner``, with loops parallel
at ATen's grain size and one-row matmuls fused; its C++ wrapper on the CPU, whose
entry point ``Direct`` calls without inductor's Python shim) or, with
``backend="fx"``, runs it as it is.

Example:
    >>> t = trace(f, "jit(f)", flat, args, kwargs, dyn=None, donated=frozenset())
    >>> run, source = compile_graph(t, "inductor")
    >>> outs = run(list(flat.tensors))
"""

from __future__ import annotations

import contextlib
import enum
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import optree
import torch
from torch import Tensor

from .._td._tree import NAMESPACE
from .._torch import CPP_WRAPPER_LOOPS
from .._torch.fake import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    TracingContext,
    UnsupportedOperatorException,
    tracing,
)
from .._torch.hop import scan_op, while_loop_op
from .._torch.ops import OpOverload, aoti
from ._jit_draws import FIX_KEYS, GLOBAL_RANDOM, draw_site, draws
from ._jit_operands import decompositions, refused_safely
from ._signature import Flat, by_bits
from ._vmap import TransformError

__all__ = ["Direct", "Static", "Traced", "compile_graph", "trace"]

_TORCH_DIR = os.path.dirname(torch.__file__)
# A CPU loop of the compiled code runs on several threads only when each gets at least
# this many elements: ATen's grain size (eager's rule), not inductor's default of 512.
# The graphs fd.jit sees are small models (many short kernels), where a fork-join per
# kernel costs more than it saves, and stalls whenever another process holds a core.
GRAIN = 32768
_CONSTANT_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    enum.Enum,
)

DATA_DEPENDENT = (
    "{name}: the function cannot be traced purely: {what}{at}. fd.jit traces it once per "
    "signature on tensors without values, so Python cannot branch on a tensor's value "
    "(`if x > 0`, `while`, `bool(x)`, `int(x)`, `.item()` or `.tolist()` used as a "
    "Python number). Compute both sides and select with torch.where(cond, a, b) (or "
    "masks, torch.clamp, torch.maximum); pass a Python value that decides the control "
    "flow as a static argument (static_argnums=...); or call the function without "
    "fd.jit. (torch: {msg})"
)
NO_FAKE = (
    "{name}: the function calls {op}, which fd.jit cannot trace (it has no shape-only "
    "kernel: a C extension or a custom op without a fake implementation){at}. Register "
    "a fake kernel for it (torch.library.register_fake), or call the function without "
    "fd.jit. (torch: {msg})"
)
MUTATES_INPUT = (
    "{name}: the function writes into its input {path} (an in-place op: x.add_(...), "
    "x[i] = ..., x.copy_(...)). A jitted function is pure: "
    "return a new tensor instead (x + 1 rather than x.add_(1), td.set(...) rather than "
    "writing a leaf). To let fd.jit reuse an input's memory for an output, donate the "
    "argument (donate_argnums=...)."
)
MUTATES_CONSTANT = (
    "{name}: the function writes into a tensor it closes over ({op}): a global side "
    "effect, which a compiled function cannot repeat (the trace already ran it once). "
    "Pass the tensor as an argument and return its new value."
)
TRACED_CONSTANT = (
    "{name}: a loop's step (fd.scan, or torch's scan/while_loop op) reads a traced tensor "
    "as a constant ({attr}) that could not be made an input of the loop; the compiled "
    "code would read garbage. Pass the tensor through the loop's carry or xs."
)
BAD_OUTPUT = (
    "{name}: the output {path} is a {kind}, not a tensor or a plain Python value; a "
    "jitted function returns pytrees of tensors (TensorDicts, tuples, dicts). {fix}"
)


class Static:
    """An argument given in ``static_argnums``: a leaf compared and hashed by value and
    closed over by the trace (never flattened, never an input of the graph). Floats
    (also in tuples) compare by their bits (``_signature.by_bits``): ``0.0`` and
    ``-0.0`` are two values, ``nan`` equals itself."""

    __slots__ = ("hash", "key", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.key = by_bits(value)
        self.hash = hash(self.key)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if type(other) is not Static:
            return False
        a, b = self.value, other.value
        if a is b:
            return True
        # by value, type too (1 and 1.0 hash alike); a tensor only by identity
        return type(a) is type(b) and not isinstance(a, Tensor) and bool(self.key == other.key)

    def __repr__(self) -> str:
        return f"static {self.value!r}"


class Traced:
    """What a trace gives: the FX graph (inputs: the call's tensor leaves in order;
    outputs: the output tensors the graph computes), the fake inputs and their
    ShapeEnv, the guards a new signature must pass to reuse it (None: none), and
    how to rebuild the output tree."""

    __slots__ = (
        "donated",
        "dyn",
        "fakes",
        "gm",
        "guards",
        "out",
        "out_computed",
        "out_leaves",
        "out_spec",
        "passthrough",
        "shape_env",
    )
    donated: Any
    dyn: Any
    fakes: Any
    gm: Any
    guards: Any
    out: Any
    out_computed: Any
    out_leaves: Any
    out_spec: Any
    passthrough: Any
    shape_env: Any


@contextlib.contextmanager
def distribution_checks_off() -> Iterator[None]:
    """torch.distributions' argument checks off for the block, restored after: a check
    reads a result on the host, which neither a trace (fd.jit) nor a CUDA graph
    recording (fd.cuda_graph) can do; torch.compile turns them off the same way."""
    D = torch.distributions.Distribution
    validate = D._validate_args
    D.set_default_validate_args(False)
    try:
        yield
    finally:
        D.set_default_validate_args(validate)


@contextlib.contextmanager
def _tracing() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` True (as torch.export's non-strict trace sets
    it) and torch.distributions' value checks off."""
    compiling = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        with distribution_checks_off():
            yield
    finally:
        torch.compiler._is_compiling_flag = compiling


def _fakes(tensors: list[Tensor], dyn: tuple[Any, ...] | None):
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    out = []
    for i, t in enumerate(tensors):
        dims = dyn[i] if dyn is not None else ()
        sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.ndim)]
        ctx = StatelessSymbolicContext(dynamic_sizes=sizes)  # type: ignore[var-annotated]
        out.append(mode.from_tensor(t, symbolic_context=ctx))
    return env, out


def _user_frame(tb) -> str:
    """`` at file:line`` of the innermost frame outside torch (the user's code)."""
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(_TORCH_DIR)]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno} (`{(f.line or '').strip()}`)"


def _translate(name: str, e: BaseException) -> BaseException | None:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    at = _user_frame(e.__traceback__)
    msg = str(e).split("\n")[0]
    if isinstance(e, GuardOnDataDependentSymNode | DataDependentOutputException):
        what = "Python needs the value of a tensor"
        return TransformError(DATA_DEPENDENT.format(name=name, what=what, at=at, msg=msg))
    if isinstance(e, DynamicOutputShapeException):
        what = "an op's output shape depends on tensor values"
        return TransformError(DATA_DEPENDENT.format(name=name, what=what, at=at, msg=msg))
    if isinstance(e, UnsupportedOperatorException):
        op = e.func if hasattr(e, "func") else msg
        return TransformError(NO_FAKE.format(name=name, op=op, at=at, msg=msg))
    return None


def trace(
    f: Callable[..., Any],
    name: str,
    flat: Flat,
    args: tuple[Any, ...],
    kwargs: dict[Any, Any],
    dyn: tuple[Any, ...] | None,
    donated: frozenset[Any],
) -> Traced:
    """Trace ``f`` on fake copies of the call's tensors (``dyn``: per tensor, the dims
    that are symbolic; None: all static) and check the graph (see the module doc).

    Raises:
        TransformError: ``f`` needs tensor values in Python, calls an op that cannot
            be traced, writes into an input or a closed-over tensor, or draws from
            torch's global generator.
        TypeError: an output leaf is neither a tensor nor a plain Python value.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    from .._torch.inductor import lowering  # noqa: F401  (inductor's decompositions read it)

    env, fakes = _fakes(flat.tensors, dyn)
    box: list[Any] = []
    t = Traced()

    def flat_fn(*tensors: Tensor) -> tuple[Any, ...]:
        it = iter(tensors)
        a, kw = flat.rebuild(args, kwargs, lambda d: [_input(v, it) for v in d.leaves])
        out = f(*a, **kw)
        paths, leaves, spec = optree.tree_flatten_with_path(out, namespace=NAMESPACE)
        box.append((out, paths, leaves, spec))
        return tuple(v for v in leaves if isinstance(v, Tensor))

    fn = torch.func.functionalize(flat_fn, remove="mutations")
    try:
        with _tracing(), torch.enable_grad():
            gm = make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(*fakes)
    except Exception as e:
        ours = _translate(name, e) or refused_safely(name, e, flat)
        if ours is not None:
            raise ours from e
        e.add_note(f"(raised while {name} traced the function on tensors without values)")  # type: ignore[attr-defined]
        raise
    out, paths, leaves, spec = box.pop()
    t.gm, t.fakes, t.shape_env, t.dyn = gm, fakes, env, dyn
    _check_graph(name, gm, flat, lambda: (flat_fn, fakes))
    _check_outputs(name, paths, leaves)
    t.out_spec = spec
    t.out_leaves = [None if isinstance(v, Tensor) else v for v in leaves]
    tensor_pos = [i for i, v in enumerate(leaves) if isinstance(v, Tensor)]
    _split_outputs(t, gm, tensor_pos, donated)
    t.out = out
    t.guards = (
        env.produce_guards_expression(fakes, ignore_static=False) if dyn is not None else None
    )
    return t


def _input(v: Any, it: Iterator[Any]) -> Any:
    if isinstance(v, Tensor):
        return next(it)
    return v.value if type(v) is Static else v


def _written(node: torch.fx.Node):
    """The node an in-place op writes into (its first mutable argument), or None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, OpOverload):
        return None
    for arg, a in zip(target._schema.arguments, node.args):
        if arg.alias_info is not None and arg.alias_info.is_write:
            return a
    return None


def _check_graph(
    name: str,
    gm: torch.fx.GraphModule,
    flat: Flat,
    again: Callable[[], tuple[Any, ...]] | None = None,
) -> None:
    """Refuse writes into inputs or closed-over tensors, draws from torch's global
    generator and traced constants in loop steps. ``again()`` runs the function once
    more as traced (``(fn, fakes)``), to find where a draw happened."""
    for sub_name, sub in gm.named_modules():
        for node in sub.graph.find_nodes(op="get_attr") if sub_name else ():
            if isinstance(getattr(sub, str(node.target), None), FakeTensor):
                attr = f"{sub_name}.{node.target}"
                raise TransformError(TRACED_CONSTANT.format(name=name, attr=attr))
        for node in sub.graph.nodes:  # a loop's step (a subgraph) too
            if draws(node.target, node.args, node.kwargs):
                op, site, fix = node.target, "", FIX_KEYS
                if again:
                    fn, fakes = again()
                    op, site, fix = draw_site(node.target, fn, fakes, _tracing)
                raise TransformError(GLOBAL_RANDOM.format(name=name, op=op, site=site, fix=fix))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in gm.graph.nodes:
        target = node.target
        into = _written(node)
        if into is None:
            continue
        if into.op == "placeholder":
            path = flat.paths()[placeholders.index(into)]
            raise TransformError(MUTATES_INPUT.format(name=name, path=path))
        if into.op == "get_attr":
            raise TransformError(MUTATES_CONSTANT.format(name=name, op=target))


def _check_outputs(name: str, paths: list[Any], leaves: list[Any]) -> None:
    for p, v in zip(paths, leaves):
        if isinstance(v, (Tensor, *_CONSTANT_TYPES)) or _int_size(v):
            continue
        where = "output" + "".join(f"[{k!r}]" for k in p)
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool | torch.Size):
            kind, fix = (
                "size that depends on the input's shape",
                "Return it as a tensor (torch.tensor(n)) or read it from the output's shape.",
            )
        elif isinstance(v, torch.distributions.Distribution):
            kind, fix = (
                type(v).__name__ + " distribution",
                "Return its parameters (or log-probs) and build the distribution outside.",
            )
        else:
            kind, fix = type(v).__name__, "Return its tensors."
        raise TypeError(BAD_OUTPUT.format(name=name, path=where, kind=kind, fix=fix))


def _int_size(v: Any) -> bool:
    return type(v) is torch.Size and all(type(n) is int for n in v)


def _split_outputs(t: Traced, gm: torch.fx.GraphModule, tensor_pos: list[Any], donated) -> None:
    """Take the outputs that are inputs out of the graph (they are the caller's
    tensors, as eager returns them); with donation, write a computed output into a
    donated input of its shape, dtype and strides, and return that input."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    values = list(out_node.args[0])
    t.passthrough, t.donated, kept, t.out_computed = [], [], [], []
    free = [j for j in sorted(donated) if j in placeholders.values()]
    by_index = {i: n for n, i in placeholders.items()}
    for pos, v in zip(tensor_pos, values):
        if v in placeholders:
            t.passthrough.append((pos, placeholders[v]))
            continue
        j = _donor(v, free, by_index) if free else None
        if j is not None:
            free.remove(j)
            with gm.graph.inserting_before(out_node):
                gm.graph.call_function(torch.ops.aten.copy_.default, (by_index[j], v))
            t.donated.append((pos, j))
            continue
        kept.append(v)
        t.out_computed.append(pos)
    out_node.args = (tuple(kept),)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _donor(v: torch.fx.Node, free: list[Any], by_index: dict[Any, Any]) -> int | None:
    """The first donated input with ``v``'s shape, dtype, device and strides."""
    val = v.meta.get("val")
    if not isinstance(val, Tensor):
        return None
    for j in free:
        w = by_index[j].meta.get("val")
        if (
            isinstance(w, Tensor)
            and w.shape == val.shape
            and w.dtype == val.dtype
            and w.device == val.device
            and w.stride() == val.stride()
        ):
            return j
    return None


def compile_graph(t: Traced, backend: str) -> tuple[Callable[[list[Any]], Any], str | None]:
    """``(run, source)``: ``run(list_of_input_tensors)`` gives the computed outputs
    (the list is consumed); ``source`` is inductor's generated code (None for "fx")."""
    gm = t.gm
    if not t.out_computed and not t.donated:
        return (lambda ins: ()), None  # nothing computed: every output is an input
    if backend == "fx":
        return (lambda ins: gm(*ins)), None
    from .._torch.inductor import compile_fx_inner
    from .._torch.inductor import config as inductor_config
    from ._jit_passes import BatchOneBmm, PostGrad

    cpu = all(x.device.type == "cpu" for x in t.fakes)
    options = {
        "cpp.min_chunk_size": GRAIN,
        # a matmul with one row (batch 1) on the CPU as a fused multiply-and-sum rather
        # than a BLAS call (inductor's own pass, off by default): 3 addmm of the tutorial
        # block cost ~5 µs each in MKL's call overhead, the fused loops under 1 µs
        "post_grad_fusion_options": {"decompose_mm_pass": {}},
        # inductor's default, pinned: a pointwise value whose expression passes 30 ops
        # becomes a buffer. Lower compiles functd.random's threefry chains faster (one
        # PPO env step: 17.7 s with 16, 22.3 s with 30) but stores more of them: every
        # stored value is a buffer allocated in each step of a loop, and PPO's
        # one-agent update ran 18% slower with 16 (notes/compile.md). With 8,
        # inductor 2.13 computed PPO's vmapped loss gradient wrong (actor grads off by
        # up to 100%); a test pins it
        "realize_opcount_threshold": 30,
        # copying views fused (not a fallback call each), batched matmuls on batch-outer
        # operands (one GEMM, not one mm per batch element): _jit_passes.py
        "post_grad_custom_post_pass": PostGrad(),
        # a batch-one bmm as an mm, so the decomposition above keeps to one-row mms
        "post_grad_custom_pre_pass": BatchOneBmm(),
    }
    with _tracing(), inductor_config.patch(options), _fake_mode_of(gm, t.fakes):
        compiled = compile_fx_inner(
            gm, t.fakes, cpp_wrapper=_cpp_wrapper(gm, cpu), is_inference=True
        )
    run = compiled.current_callable
    # inductor's C++ shim appends the graph's tensor constants to the inputs: only a
    # graph without constants may skip it (else the entry reads past its inputs)
    if not gm.graph.find_nodes(op="get_attr"):
        run = _direct(run)
    return run, getattr(compiled, "source_code", None)


def _cpp_wrapper(gm: torch.fx.GraphModule, cpu: bool) -> bool:
    """inductor's C++ wrapper on the CPU; its Python one for a graph with a loop op on a
    torch whose C++ wrapper cannot compile loops (``CPP_WRAPPER_LOOPS``: torch < 2.13)."""
    if not cpu or CPP_WRAPPER_LOOPS:
        return cpu
    return not any(n.target in (scan_op, while_loop_op) for n in gm.graph.nodes)


def _fake_mode_of(gm: torch.fx.GraphModule, fakes: list[Any]) -> Any:
    """A graph without tensor inputs: its trace's fake mode made current, which inductor
    would otherwise replace by one without a ShapeEnv (in which its lowering of a loop
    op fails: "DataDependentOutputException: aten._local_scalar_dense")."""
    if fakes:
        return contextlib.nullcontext()
    for node in gm.graph.nodes:
        v = node.meta.get("val")
        if isinstance(v, FakeTensor):
            return tracing(TracingContext(v.fake_mode))
    return contextlib.nullcontext()


class Direct:
    """The C++ wrapper's entry point called without its Python shim (inductor's ``g``:
    a per-input isinstance loop around the same three calls)."""

    __slots__ = ("alloc", "entry", "steal")

    def __init__(
        self, alloc: Callable[..., Any], entry: Callable[..., Any], steal: Callable
    ) -> None:
        self.alloc, self.entry, self.steal = alloc, entry, steal

    def __call__(self, ins: list[Any]) -> list[Any]:
        return self.steal(self.entry(self.alloc(ins)))


def _direct(run: Callable[..., Any]) -> Callable[..., Any]:
    """``Direct`` for inductor's C++ wrapper shim; any other callable (a Python
    wrapper, inductor's input-realigning wrapper) as it is."""
    cells = getattr(run, "__closure__", None)
    if getattr(run, "__name__", "") != "g" or not cells or len(cells) != 1:
        return run
    entry = cells[0].cell_contents
    alloc = getattr(aoti, "unsafe_alloc_void_ptrs_from_tensors", None)
    steal = getattr(aoti, "alloc_tensors_by_stealing_from_void_ptrs", None)
    if type(entry).__name__ != "builtin_function_or_method" or alloc is None or steal is None:
        return run
    return Direct(alloc, entry, steal)

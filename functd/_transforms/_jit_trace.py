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
import linecache
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import optree
import torch
from torch import Tensor

from .._td._tree import NAMESPACE
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
GLOBAL_RANDOM = (
    "{name}: the function draws from torch's global generator ({op}){site}, a global side "
    "effect a compiled function would replay with frozen state. {fix}"
)
FIX_KEYS = (
    "In functd randomness comes from keys: pass a key as an argument (fd.random.key(0)) "
    "and draw with fd.random.normal(key, shape) or call modules with key=."
)
FIX_ATTENTION = (
    "Draw attention dropout from a key: fd.nn.scaled_dot_product_attention(q, k, v, "
    "dropout_p=p, key=key) (functd answers torch's F.scaled_dot_product_attention with it "
    "in a torch module in training mode called with key=), or pass dropout_p=0.0."
)
FIX_EVAL_MODULE = (
    "{module} draws in eval mode, where functd gives a torch module no key: draw only when "
    "`self.training` (then functd answers torch.rand, F.dropout, ... with draws from the "
    "call's key=), or pass the noise in as an input drawn with fd.random; or call the "
    "model without fd.jit."
)
FIX_HIDDEN = (
    "In a torch module in training mode functd answers the random functions it knows "
    "(F.dropout, torch.rand, torch.normal, ...) with draws from the call's key=; this draw "
    "comes from one it has no keyed version of, or runs inside another torch function: "
    "draw with one of those (or pass the noise in as an input drawn with fd.random), or "
    "call the model without fd.jit."
)
TRACED_CONSTANT = (
    "{name}: a loop's step (fd.scan, or torch's scan/while_loop op) reads a traced tensor "
    "as a constant ({attr}) that could not be made an input of the loop; the compiled "
    "code would read garbage. Pass the tensor through the loop's carry or xs."
)
BAD_OPERANDS = (
    "{name}: {op} refuses its operands {operands}{at}: {why}. Eager PyTorch refuses "
    "these arguments too (fd.jit checks them at the first call of each signature, "
    "before any compiled code runs). {fix}"
)
_WHY = {
    "dtype": (
        "they have different dtypes and this op does not promote",
        "Convert one of them: before the call (`p.to(torch.float32)`) or inside the "
        "function (`x.to(p.dtype)`).",
    ),
    "device": (
        "they are on different devices",
        "Move the arguments to one device before the call (`td.to(device)`).",
    ),
    "shape": ("{msg}", "Check the shapes of these arguments."),
}
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


def _fakes(tensors: list[Tensor], dyn: tuple | None):
    from torch._subclasses.fake_tensor import FakeTensorMode
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


def _user_frame_of(frames: list) -> str:
    """``_user_frame`` of the innermost of ``frames`` (frame objects)."""
    if not frames:
        return ""
    fr = frames[-1]
    line = linecache.getline(fr.f_code.co_filename, fr.f_lineno).strip()
    return f" at {fr.f_code.co_filename}:{fr.f_lineno} (`{line}`)"


def _translate(name: str, e: BaseException) -> BaseException | None:
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )
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


# ------------------------------------------------------------------ operand checks
class _MixedDtypes(RuntimeError):
    """Raised during a trace by an op that eager PyTorch runs only on operands of one
    dtype (fake tensors do not check it); ``_refused`` rewrites it."""


def _same_dtype_ops() -> dict:
    """Op -> the operands eager PyTorch requires to share a dtype. ``?``: only on the
    CPU (a ``bias``-like operand: CUDA takes an fp32 one for some); ``~``: unless it
    has no dims (eager takes a 0-dim lerp weight of any float dtype)."""
    A = torch.ops.aten
    mat, batches = ("self", "mat2"), ("?self", "batch1", "batch2")
    return {
        A.mm.default: mat,
        A.bmm.default: mat,
        A.addmm.default: ("?self", "mat1", "mat2"),
        A.baddbmm.default: batches,
        A.addbmm.default: batches,
        A.mv.default: ("self", "vec"),
        A.addmv.default: ("?self", "mat", "vec"),
        A.dot.default: ("self", "tensor"),
        A.vdot.default: ("self", "tensor"),
        A.convolution.default: ("input", "weight", "bias"),
        A.linalg_cross.default: ("self", "other"),
        A.lerp.Scalar: ("self", "end"),
        A.lerp.Tensor: ("self", "end", "~weight"),
        A.index_put.default: ("self", "values"),
    }


def _bound(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An op's call as {schema argument name: value}."""
    out = {}
    for i, a in enumerate(op._schema.arguments):
        out[a.name] = args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
    return out


def _checked(op: torch._ops.OpOverload, names: tuple, decomp: Callable | None) -> Callable:
    """A decomposition-table entry for ``op``: raises ``_MixedDtypes`` when the operands
    ``names`` differ in dtype, else defers to ``decomp`` (None: no decomposition)."""

    def check(*args: Any, **kwargs: Any) -> Any:
        bound = _bound(op, args, kwargs)
        vals = []
        for n in names:
            v = bound.get(n.lstrip("?~"))
            if not isinstance(v, Tensor) or (n[0] == "?" and v.device.type != "cpu"):
                continue
            if not (n[0] == "~" and v.dim() == 0):
                vals.append(v)
        if len({v.dtype for v in vals}) > 1:
            raise _MixedDtypes(f"{op} takes operands of one dtype")
        return NotImplemented if decomp is None else decomp(*args, **kwargs)

    return check


def _decompositions() -> dict:
    """Inductor's decomposition table with the dtype checks of ``_same_dtype_ops``."""
    from torch._inductor.decomposition import select_decomp_table

    table = dict(select_decomp_table())
    for op, names in _same_dtype_ops().items():
        table[op] = _checked(op, names, table.get(op))
    return table


def _frames(tb: Any) -> list:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _is_torch(frame: Any) -> bool:
    return str(frame.f_code.co_filename).startswith(_TORCH_DIR)


# where torch checks an op's operands: torch._check, a C++ kernel called from
# OpOverload.__call__, fake/meta kernels, references, decompositions (not, e.g., the
# custom-op machinery saying an op has no fake kernel)
_CHECKERS = ("__init__.py", "_ops.py", "_subclasses", "_meta_registrations.py", "_refs", "_prims")
_OP_CHECKS = tuple(os.path.join(_TORCH_DIR, p) for p in (*_CHECKERS, "_decomp", "_inductor"))


def _refused(name: str, e: BaseException, flat: Flat) -> BaseException | None:
    """``e`` as a functd error naming the op and its operands (dtype, shape, device,
    and the argument paths they come from), when an op refused its operands during
    the trace: its fake kernel raised (shapes, devices, some dtypes) or
    ``_same_dtype_ops`` did. None for any other error."""
    if not isinstance(e, RuntimeError) or isinstance(e, TransformError):
        return None
    frames = _frames(e.__traceback__)
    calls = [
        i for i, fr in enumerate(frames) if fr.f_code.co_name == "proxy_call" and _is_torch(fr)
    ]
    if not calls:
        return None
    k = calls[-1]  # the innermost op being traced
    if not isinstance(e, _MixedDtypes) and (
        not all(_is_torch(fr) for fr in frames[k + 1 :])
        or not frames[-1].f_code.co_filename.startswith(_OP_CHECKS)
    ):
        return None  # not an op's check of its operands
    loc = frames[k].f_locals
    op, mode = loc.get("func"), loc.get("proxy_mode")
    if not isinstance(op, torch._ops.OpOverload):
        return None
    outer = next(
        (fr.f_locals.get("tracer") for fr in frames if fr.f_code.co_name == "dispatch_trace"),
        None,
    )
    tracer = getattr(mode, "tracer", None)
    bound = _bound(op, tuple(loc.get("args") or ()), dict(loc.get("kwargs") or {}))
    tensors = {n: v for n, v in bound.items() if isinstance(v, Tensor)}
    paths = flat.paths() if tracer is not None and tracer is outer else None
    msg = str(e).split("\n")[0].strip().rstrip(".")
    kind = "shape"
    if len({v.device for v in tensors.values()}) > 1:
        kind = "device"
    elif isinstance(e, _MixedDtypes) or (
        len({v.dtype for v in tensors.values()}) > 1 and ("dtype" in msg or "type" in msg)
    ):
        kind = "dtype"
    why, fix = _WHY[kind]
    if not isinstance(e, _MixedDtypes):
        why = why.format(msg=msg) + ("" if kind == "shape" else f" (torch: {msg})")
    operands = ", ".join(
        _operand(n, v, kind == "device", _sources(v, tracer, paths)) for n, v in tensors.items()
    )
    at = _user_frame_of([fr for fr in frames[:k] if not _is_torch(fr)])
    return TransformError(
        BAD_OPERANDS.format(name=name, op=op, operands=operands, at=at, why=why, fix=fix)
    )


def _refused_safely(name: str, e: BaseException, flat: Flat) -> BaseException | None:
    """``_refused``, or None where reading torch's frames fails (torch's error then)."""
    try:
        return _refused(name, e, flat)
    except Exception:
        return None


def _operand(n: str, v: Tensor, device: bool, sources: list[str] | None) -> str:
    """``self: float32[4, 3] (from args[1]['x'])``; ``sources`` None: not known."""
    dtype = str(v.dtype).replace("torch.", "")
    where = f" on {v.device}" if device else ""
    if sources is None:
        return f"{n}: {dtype}{list(v.shape)}{where}"
    src = f"from {', '.join(sources)}" if sources else "computed in the function"
    return f"{n}: {dtype}{list(v.shape)}{where} ({src})"


def _sources(v: Tensor, tracer: Any, paths: list[str] | None, limit: int = 3) -> list | None:
    """The argument paths ``v`` was computed from without a dtype change (through
    views, copies, arithmetic with its own dtype): the graph's placeholders reached
    from its node through nodes of its dtype; at most ``limit``. None when not known
    (``paths`` None: an op inside a loop's body, traced apart)."""
    if paths is None:
        return None
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    slot = get_proxy_slot(v, tracer, None)
    node = getattr(getattr(slot, "proxy", None), "node", None)
    if node is None:
        return []
    order = {n: i for i, n in enumerate(tracer.graph.find_nodes(op="placeholder"))}
    found: list[str] = []
    seen, stack = {node}, [node]
    while stack and len(seen) < 1000:
        n = stack.pop()
        if n in order:
            if order[n] < len(paths):
                found.append(paths[order[n]])
            continue
        for m in n.all_input_nodes:
            val = m.meta.get("val")
            if m not in seen and isinstance(val, Tensor) and val.dtype == v.dtype:
                seen.add(m)
                stack.append(m)
    found = sorted(set(found), key=paths.index)
    return found[:limit] + (["..."] if len(found) > limit else [])


def trace(
    f: Callable,
    name: str,
    flat: Flat,
    args: tuple,
    kwargs: dict,
    dyn: tuple | None,
    donated: frozenset,
) -> Traced:
    """Trace ``f`` on fake copies of the call's tensors (``dyn``: per tensor, the dims
    that are symbolic; None: all static) and check the graph (see the module doc).

    Raises:
        TransformError: ``f`` needs tensor values in Python, calls an op that cannot
            be traced, writes into an input or a closed-over tensor, or draws from
            torch's global generator.
        TypeError: an output leaf is neither a tensor nor a plain Python value.
    """
    import torch._inductor.lowering  # inductor's decompositions read it (max pooling)
    from torch.fx.experimental.proxy_tensor import make_fx

    env, fakes = _fakes(flat.tensors, dyn)
    box: list = []
    t = Traced()

    def flat_fn(*tensors: Tensor) -> tuple:
        it = iter(tensors)
        a, kw = flat.rebuild(args, kwargs, lambda d: [_input(v, it) for v in d.leaves])
        out = f(*a, **kw)
        paths, leaves, spec = optree.tree_flatten_with_path(out, namespace=NAMESPACE)
        box.append((out, paths, leaves, spec))
        return tuple(v for v in leaves if isinstance(v, Tensor))

    fn = torch.func.functionalize(flat_fn, remove="mutations")
    try:
        with _tracing(), torch.enable_grad():
            gm = make_fx(fn, decomposition_table=_decompositions(), tracing_mode="fake")(*fakes)
    except Exception as e:
        ours = _translate(name, e) or _refused_safely(name, e, flat)
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


def _input(v: Any, it: Iterator) -> Any:
    if isinstance(v, Tensor):
        return next(it)
    return v.value if type(v) is Static else v


def _written(node: torch.fx.Node):
    """The node an in-place op writes into (its first mutable argument), or None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    for arg, a in zip(target._schema.arguments, node.args):
        if arg.alias_info is not None and arg.alias_info.is_write:
            return a
    return None


def _draws(op: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a call of ``op`` draws from torch's global generator: the op is tagged
    ``nondeterministic_seeded`` and its arguments do not rule the draw out. torch tags
    an op by what it may do: the fused attention kernels whatever their ``dropout_p``,
    ``aten.lstm``/``gru``/``rnn_*`` whatever their ``dropout``, dropout whatever its
    ``train``. ``dropout_p`` or ``dropout`` 0 (attention in eval), one RNN layer (its
    dropout acts between layers) or ``train``/``training`` False draw nothing."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    schema = op._schema.arguments
    value = {a.name: a.default_value for a in schema}
    value.update(zip((a.name for a in schema), args))
    value.update(kwargs)
    if value.get("train") is False or value.get("training") is False:
        return False
    if value.get("num_layers") == 1:
        return False
    return not any(type(value.get(p)) in (int, float) and value[p] == 0 for p in _DROPOUT)


_DROPOUT = ("dropout_p", "dropout")


class _Draw(Exception):
    """Raised by ``_FindDraw`` at the first draw, with the Python frame that made it."""

    def __init__(self, op: Any, frame: Any) -> None:
        super().__init__()
        self.op, self.frame = op, frame


def _draw_site(op: Any, fn: Callable, fakes: list) -> tuple[str, str, str]:
    """``(op, site, fix)`` for the draw ``op`` the graph holds: the op as torch code
    called it (the graph's may come from its decomposition), `` in <torch module>
    (submodule `path`) of <functd module> at file:line (`code`)`` and the way around.
    Runs ``fn`` once more on the fakes under a dispatch mode that stops at the first
    drawing op: only a refusal pays for finding the site, the trace records no stacks.
    Without a site (the run did not reach the draw): ``(op, "", fix)``."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Called(TorchFunctionMode):  # the torch function the Python code called
        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.func = func
            return func(*args, **(kwargs or {}))

    class _FindDraw(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if _draws(func, args, kwargs or {}):
                raise _Draw(func, sys._getframe(1))
            return func(*args, **(kwargs or {}))

    from torch._subclasses.fake_tensor import FakeTensorMode

    # the trace's fake mode (a function of no tensors: a new one), so nothing runs for real
    mode = next((t.fake_mode for t in fakes if hasattr(t, "fake_mode")), None)
    fake = mode or FakeTensorMode(allow_non_fake_inputs=True)
    called = _Called()
    try:
        with _tracing(), torch.enable_grad(), fake, _FindDraw(), called:
            fn(*fakes)
    except _Draw as found:
        site, module = _site(found.frame, fn.__code__)
        name = getattr(getattr(called, "func", None), "__name__", None)
        via = f"{name}(...)" if name else found.op if found.op != op else None
        shown = f"{op}, from {via}" if via else str(op)
        return shown, site, _fix(found.op, name, module)
    except Exception:  # the refusal stands; only its site is unknown
        pass
    return str(op), "", _fix(op, None, None)


def _site(frame: Any, stop: Any) -> tuple[str, torch.nn.Module | None]:
    """The site's text and the innermost torch module, from the frames between a draw
    and ``stop`` (the traced function's code): the innermost torch module's
    ``forward``, its path in the module a ``FunctionalCall`` runs, the innermost
    functd module, and the innermost line outside torch."""
    from .._modules._call import ModuleKind
    from ..nn._functional_call import FunctionalCall

    at = torch_module = root = label = None
    while frame is not None and frame.f_code is not stop:
        code, me = frame.f_code, frame.f_locals.get("self")
        if at is None and not code.co_filename.startswith((_TORCH_DIR, __file__)):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            at = f" at {code.co_filename}:{frame.f_lineno} (`{line}`)"
        if torch_module is None and code.co_name == "forward" and isinstance(me, torch.nn.Module):
            torch_module = me
        if root is None and isinstance(me, FunctionalCall):
            root = me.module
        if label is None and isinstance(me, ModuleKind):
            label = me._label()
        frame = frame.f_back
    where = []
    if torch_module is not None:
        named = root.named_modules() if root is not None else ()
        path = next((n for n, m in named if m is torch_module and n), None)
        where.append(type(torch_module).__name__ + (f" (submodule `{path}`)" if path else ""))
    if label is not None:
        where.append(f"of {label}" if where else label)
    return (" in " + " ".join(where) if where else "") + (at or ""), torch_module


def _fix(op: Any, called: str | None, module: torch.nn.Module | None) -> str:
    """The way around a draw of ``op`` (from the torch function ``called``, in the
    torch module ``module``)."""
    if called == "scaled_dot_product_attention" or any(
        a.name == "dropout_p" for a in op._schema.arguments
    ):
        return FIX_ATTENTION
    if module is None:
        return FIX_KEYS
    if not module.training:
        return FIX_EVAL_MODULE.format(module=type(module).__name__)
    return FIX_HIDDEN


def _check_graph(
    name: str, gm: torch.fx.GraphModule, flat: Flat, again: Callable[[], tuple] | None = None
) -> None:
    """Refuse writes into inputs or closed-over tensors, draws from torch's global
    generator and traced constants in loop steps. ``again()`` runs the function once
    more as traced (``(fn, fakes)``), to find where a draw happened."""
    from torch._subclasses.fake_tensor import FakeTensor

    for sub_name, sub in gm.named_modules():
        for node in sub.graph.find_nodes(op="get_attr") if sub_name else ():
            if isinstance(getattr(sub, str(node.target), None), FakeTensor):
                attr = f"{sub_name}.{node.target}"
                raise TransformError(TRACED_CONSTANT.format(name=name, attr=attr))
        for node in sub.graph.nodes:  # a loop's step (a subgraph) too
            if _draws(node.target, node.args, node.kwargs):
                op, site, fix = (
                    _draw_site(node.target, *again()) if again else (node.target, "", FIX_KEYS)
                )
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


def _check_outputs(name: str, paths: list, leaves: list) -> None:
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


def _split_outputs(t: Traced, gm: torch.fx.GraphModule, tensor_pos: list, donated) -> None:
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


def _donor(v: torch.fx.Node, free: list, by_index: dict) -> int | None:
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


def compile_graph(t: Traced, backend: str) -> tuple[Callable[[list], Any], str | None]:
    """``(run, source)``: ``run(list_of_input_tensors)`` gives the computed outputs
    (the list is consumed); ``source`` is inductor's generated code (None for "fx")."""
    gm = t.gm
    if not t.out_computed and not t.donated:
        return (lambda ins: ()), None  # nothing computed: every output is an input
    if backend == "fx":
        return (lambda ins: gm(*ins)), None
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

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
    with _tracing(), inductor_config.patch(options):
        compiled = compile_fx_inner(gm, t.fakes, cpp_wrapper=cpu, is_inference=True)
    run = compiled.current_callable  # type: ignore[attr-defined]
    # inductor's C++ shim appends the graph's tensor constants to the inputs: only a
    # graph without constants may skip it (else the entry reads past its inputs)
    if not gm.graph.find_nodes(op="get_attr"):
        run = _direct(run)
    return run, getattr(compiled, "source_code", None)


class Direct:
    """The C++ wrapper's entry point called without its Python shim (inductor's ``g``:
    a per-input isinstance loop around the same three calls)."""

    __slots__ = ("alloc", "entry", "steal")

    def __init__(self, alloc: Callable, entry: Callable, steal: Callable) -> None:
        self.alloc, self.entry, self.steal = alloc, entry, steal

    def __call__(self, ins: list) -> list:
        return self.steal(self.entry(self.alloc(ins)))


def _direct(run: Callable) -> Callable:
    """``Direct`` for inductor's C++ wrapper shim; any other callable (a Python
    wrapper, inductor's input-realigning wrapper) as it is."""
    cells = getattr(run, "__closure__", None)
    if getattr(run, "__name__", "") != "g" or not cells or len(cells) != 1:
        return run
    entry = cells[0].cell_contents
    aoti = getattr(torch._C, "_aoti", None)
    alloc = getattr(aoti, "unsafe_alloc_void_ptrs_from_tensors", None)
    steal = getattr(aoti, "alloc_tensors_by_stealing_from_void_ptrs", None)
    if type(entry).__name__ != "builtin_function_or_method" or alloc is None or steal is None:
        return run
    return Direct(alloc, entry, steal)

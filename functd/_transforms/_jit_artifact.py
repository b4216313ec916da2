"""Compiled artifacts of ``fd.jit``: lower a signature, compile it ahead of time with
AOTInductor, save it, and load it in another process without compiling.

``jstep.lower(*args)`` gives a ``Lowered`` (the signature, the traced graph and the
generated code of fd.jit's own entry); its ``compile()`` traces the function once
more for the artifact (static shapes, nothing donated) and builds an AOTInductor
package of the graph (``functd._torch.aoti``): a ``Compiled``, callable like the
jitted function with that one signature. ``save(path)`` writes the package, a PT2
archive (a zip) that holds the shared library and, as an extra file,
``functd.json``: the input signature and the output tree as plain JSON
(``_jit_artifact_spec``), the torch version, and the CPU capability (and CUDA device
capabilities) it was built for. ``load_compiled(path)`` refuses a file another user
could have written, reads ``functd.json`` before anything else and refuses a package
built by another torch or for another CPU/GPU, then opens the library with
torch's C++ package loader: no pickle is read, no code of the user is imported.

A call of a ``Compiled`` flattens its arguments (the same ``Flat`` as fd.jit),
describes them as ``functd.json`` does, and raises a ``TypeError`` naming the first
argument path that differs (expected vs got); static arguments (``static_argnums``)
are baked in and must be passed with the value they were lowered with. Outputs come
back as fd.jit's call gives them: TensorDicts with their batch sizes, inputs passed
through as the caller's tensors, constants as values.

Example:
    >>> jstep = fd.jit(step)
    >>> jstep.lower(params, batch).save("step.pt2")      # once, on the build machine
    >>> step = fd.load_compiled("step.pt2")             # elsewhere: no compile
    >>> out = step(params, batch)
"""

from __future__ import annotations

import io
import json
import os
import platform
import stat
import tempfile
import zipfile
from collections.abc import Callable
from typing import Any

import optree
import torch

from .._td._tree import NAMESPACE
from .._torch import aoti
from ._jit_artifact_spec import inputs, mismatch, outputs, rebuild
from ._jit_compile_options import GRAIN
from ._jit_trace import Static, Traced
from ._signature import Flat
from ._vmap import TransformError

__all__ = ["Compiled", "Lowered", "build", "load_compiled"]

FORMAT, VERSION = "functd.jit artifact", 1
META = "functd.json"
# inductor's options for the artifact: fd.jit's loop grain (see _jit_compile_options.GRAIN)
_OPTIONS: dict[str, Any] = {"cpp.min_chunk_size": GRAIN}

SIGNATURE = (
    "{name}: the call does not have the signature this artifact was compiled for; "
    "{why}. A compiled artifact runs one signature (print(compiled.signature)); lower "
    "and save one for this call: fd.jit(f).lower(*args).save(path)."
)
NEEDS_GRAD = (
    "{name}: input(s) {paths} require grad; a compiled artifact returns tensors without "
    "autograd history. Pass them detached (`.detach()`), or call under torch.no_grad()."
)
OTHER_BUILD = (
    "fd.load_compiled({path!r}): the artifact was built {what} {built}; this {here} "
    "{now}. Its compiled library runs only there: lower and save it again on this "
    "machine, with this torch (fd.jit(f).lower(*args).save(path))."
)
WRITABLE = (
    "fd.load_compiled({path!r}): the {what} {where} {why}; loading an artifact runs its "
    "shared library, which that user could have replaced. Keep artifacts in a folder "
    "only you (or root) can write: `chmod go-w {where}` once you trust its content."
)


class Lowered:
    """What ``jstep.lower(*args)`` gives for the signature of ``args``: in words
    (``signature``), the dims that are symbolic per input tensor (``dynamic``), the
    traced FX graph and inductor's generated code of fd.jit's entry (``graph``,
    ``source``; None with ``backend="fx"``); ``compile()`` and ``save(path)`` make an
    artifact of this signature (static shapes) that ``fd.load_compiled`` loads.

    Example:
        >>> lowered = fd.jit(block).lower(params, td)
        >>> print(lowered.source)
        >>> lowered.save("block.pt2")
    """

    __slots__ = ("_aot", "_compiled", "dynamic", "from_disk", "graph", "signature", "source")

    def __init__(
        self,
        signature: str,
        dynamic: tuple[Any, ...],
        graph: str,
        source: str | None,
        aot: Callable[[], Compiled] | None = None,
        *,
        from_disk: bool = False,
    ) -> None:
        self.signature, self.dynamic, self.graph, self.source = signature, dynamic, graph, source
        self.from_disk = from_disk  # fd.jit's entry came from inductor's cache on disk
        self._aot = aot
        self._compiled: Compiled | None = None

    def __str__(self) -> str:
        head = f"# signature: {self.signature}" + " (from disk)" * self.from_disk
        return f"{head}\n# graph\n{self.graph}\n# code\n{self.source}"

    def __repr__(self) -> str:
        return f"Lowered({self.signature})"

    def compile(self) -> Compiled:
        """This signature compiled ahead of time (AOTInductor; once per ``Lowered``),
        callable like the jitted function with this signature. Compiles with inductor
        whatever the wrapper's ``backend``."""
        compiled = self._compiled
        if compiled is None:
            if self._aot is None:
                raise RuntimeError("Lowered.compile(): this Lowered was not made by jit.lower")
            compiled = self._compiled = self._aot()
        return compiled

    def save(self, path: str | os.PathLike[str]) -> None:
        """``self.compile().save(path)``: write the artifact (a ``.pt2`` file)."""
        self.compile().save(path)


class Compiled:
    """One signature of a jitted function, compiled ahead of time: call it with
    arguments of that signature (checked: a ``TypeError`` names what differs); save it
    with ``save(path)``; ``fd.load_compiled(path)`` gives it back in another process.

    Example:
        >>> compiled = fd.jit(block).lower(params, td).compile()
        >>> out = compiled(params, td)
        >>> compiled.save("block.pt2")
    """

    __slots__ = ("_blob", "_meta", "_name", "_runner", "_static")

    def __init__(self, meta: dict[str, Any], blob: bytes, runner: Any) -> None:
        self._meta, self._blob, self._runner = meta, blob, runner
        self._name = f"compiled {meta['function']}"
        self._static = [i for i, a in enumerate(meta["inputs"]) if a["kind"] == "static"]

    @property
    def signature(self) -> str:
        """The signature it runs, in words (as ``Lowered.signature``)."""
        return str(self._meta["signature"])

    def __repr__(self) -> str:
        return f"Compiled({self._meta['function']}: {self.signature})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._static:
            args = tuple(_static(a) if i in self._static else a for i, a in enumerate(args))
        flat = Flat(args, kwargs, {})
        why = mismatch(self._name, self._meta["inputs"], inputs(flat, self._name))
        if why is not None:
            raise TypeError(SIGNATURE.format(name=self._name, why=why))
        if flat.grad and torch.is_grad_enabled():
            paths = [p for p, t in zip(flat.paths(), flat.tensors) if t.requires_grad]
            raise TransformError(NEEDS_GRAD.format(name=self._name, paths=", ".join(paths[:5])))
        ins = list(flat.tensors)
        computed = self._runner.run(ins) if self._runner is not None else []
        return rebuild(self._meta["outputs"], computed, ins)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the artifact to ``path`` (replaced whole: a reader never sees half a
        file; mode 0o644)."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        fd_, tmp = tempfile.mkstemp(dir=folder, prefix=".functd-", suffix=".pt2")
        try:
            with os.fdopen(fd_, "wb") as fh:
                fh.write(self._blob)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def _static(v: Any) -> Any:
    """A static argument as fd.jit wraps it (an unhashable one as it is: the
    signature check then names it)."""
    try:
        return Static(v)
    except TypeError:
        return v


def _where_built(devices: set[torch.device]) -> dict[str, Any]:
    """The torch, machine and CPU/CUDA capabilities code for ``devices`` is built for
    (the CPU's too when a CPU tensor is among them, or no tensor at all)."""
    cuda = {str(d): list(torch.cuda.get_device_capability(d)) for d in devices if d.type == "cuda"}
    cpu = not cuda or any(d.type == "cpu" for d in devices)
    return {
        "torch": str(torch.__version__),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if cpu else None,
        "cuda_capability": cuda,
    }


def build(name: str, signature: str, flat: Flat, traced: Traced) -> Compiled:
    """The ``Compiled`` of a trace made for an artifact (``dyn=None``, nothing
    donated): its metadata, its AOTInductor package, loaded."""
    leaves = optree.tree_leaves(traced.out, namespace=NAMESPACE)
    sources: dict[int, list[Any]] = {}
    for k, i in enumerate(traced.out_computed):
        sources.setdefault(id(leaves[i]), ["c", k])
    for i, j in traced.passthrough:
        sources.setdefault(id(leaves[i]), ["i", j])
    meta = {"format": FORMAT, "version": VERSION, "function": name, "signature": signature}
    meta.update(_where_built(flat.devices))
    meta.update(inputs=inputs(flat, name), outputs=outputs(traced.out, sources, name))
    meta["computed"] = len(traced.out_computed)
    files = aoti.aot_compile(traced.gm, flat.tensors, _OPTIONS) if meta["computed"] else None
    with tempfile.TemporaryDirectory(prefix="functd-aot-") as tmp:
        path = os.path.join(tmp, "artifact.pt2")
        aoti.package(path, files, {META: json.dumps(meta)})
        with open(path, "rb") as fh:
            blob = fh.read()
        runner = aoti.loader(path) if files else None
    return Compiled(meta, blob, runner)


def _check_writers(path: str) -> None:
    """Refuse ``path`` or its folder when a user other than this one (or root) owns
    it or may write it (a folder with the sticky bit, as /tmp, may be world-writable:
    only its owners can replace files in it)."""
    me = os.geteuid()
    for what, where in (("file", path), ("folder", os.path.dirname(os.path.abspath(path)))):
        st = os.stat(where)
        writers = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if st.st_uid not in (me, 0):
            why = f"belongs to another user (uid {st.st_uid}; you are {me})"
        elif writers and not (what == "folder" and st.st_mode & stat.S_ISVTX):
            why = f"can be written by other users (mode {oct(stat.S_IMODE(st.st_mode))})"
        else:
            continue
        raise PermissionError(WRITABLE.format(path=path, what=what, where=where, why=why))


def _read_meta(path: str, blob: bytes) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            name = next(n for n in z.namelist() if n.endswith(f"/{aoti.EXTRA_DIR}{META}"))
            meta = json.loads(z.read(name))
    except (zipfile.BadZipFile, StopIteration, ValueError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"fd.load_compiled({path!r}): not an artifact of fd.jit (a PT2 archive with "
            f"extra/{META}); fd.load_compiled loads what Lowered.save / Compiled.save wrote."
        )
    if meta.get("version") != VERSION:
        raise ValueError(
            f"fd.load_compiled({path!r}): artifact format version {meta.get('version')!r}; "
            f"this functd reads version {VERSION}: save it again with this functd."
        )
    return meta


def _check_built_here(path: str, meta: dict[str, Any]) -> None:
    here = _where_built(set())
    if meta["torch"] != here["torch"]:
        args = ("by torch", meta["torch"], "is torch", here["torch"])
        raise RuntimeError(
            OTHER_BUILD.format(path=path, what=args[0], built=args[1], here=args[2], now=args[3])
        )
    if meta["machine"] != here["machine"]:
        raise RuntimeError(
            OTHER_BUILD.format(
                path=path, what="for", built=meta["machine"], here="machine is", now=here["machine"]
            )
        )
    cap, now = meta["cpu_capability"], torch.backends.cpu.get_cpu_capability()
    if cap is not None and cap != now:
        raise RuntimeError(
            OTHER_BUILD.format(
                path=path,
                what="for the CPU capability",
                built=cap,
                here="CPU's is",
                now=f"{now} (torch.backends.cpu.get_cpu_capability())",
            )
        )
    for dev, want in meta["cuda_capability"].items():
        got = list(torch.cuda.get_device_capability(dev)) if torch.cuda.is_available() else None
        if got != want:
            built = f"{dev} of compute capability {'.'.join(map(str, want))}"
            now = "none" if got is None else ".".join(map(str, got))
            raise RuntimeError(
                OTHER_BUILD.format(path=path, what="for", built=built, here=f"{dev} is", now=now)
            )


def load_compiled(path: str | os.PathLike[str]) -> Compiled:
    """Load an artifact that ``Lowered.save``/``Compiled.save`` wrote: a callable that
    runs the saved signature without compiling (checked per call, as fd.jit's entry:
    a ``TypeError`` names the argument path that differs, expected vs got).

    Loading runs the artifact's shared library, so the file and its folder must be
    writable by their owner only (you or root); nothing in it is unpickled.

    Raises:
        PermissionError: another user owns or may write the file or its folder.
        ValueError: the file is not an artifact of fd.jit.
        RuntimeError: it was built by another torch, or for another CPU capability,
            machine or CUDA device: lower and save it again here.

    Example:
        >>> step = fd.load_compiled("step.pt2")
        >>> params, opt_state, metrics = step(params, opt_state, batch, key)
    """
    path = os.fspath(path)
    _check_writers(path)
    with open(path, "rb") as fh:
        blob = fh.read()
    meta = _read_meta(path, blob)
    _check_built_here(path, meta)
    runner = None
    if meta["computed"]:
        with tempfile.TemporaryDirectory(prefix="functd-aot-") as tmp:
            copy = os.path.join(tmp, "artifact.pt2")  # the bytes checked are the bytes loaded
            with open(copy, "wb") as fh:
                fh.write(blob)
            runner = aoti.loader(copy)
    return Compiled(meta, blob, runner)

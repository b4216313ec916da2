"""``fd.fit``'s checkpoints: what one holds, how they rotate, how a run resumes.

A checkpoint is the dict ``{"params", "opt_state", "epoch", "step", "history",
"run"}`` written with ``fd.save`` at the end of an epoch: ``epoch`` is the
number of epochs done, ``step`` the global step counter (step ``i`` gets
``fold_in(key, i)``), ``history`` the metrics so far (``None`` before the first
step) and ``run`` the fingerprint of the run that wrote it: the key path, dtype
and shape of every leaf of ``params`` and ``opt_state``, ``epochs`` and the key.
Resuming from it continues the run bitwise: nothing else decides what the next
step computes (``batches(epoch)`` is a function of the epoch, and functd draws
nothing from torch's global generator).

**Rotation.** ``keep`` files: ``path`` (the newest), ``path.1`` (the one
before), ..., ``path.{keep-1}``. A write goes to ``path.tmp`` first (``fd.save``: atomic, fsynced),
then the older files shift by one name (``os.replace``), ``path.1`` becomes a
hard link to the current ``path``, and ``path.tmp`` replaces ``path``; the
folder is fsynced. At every moment ``path`` is a complete checkpoint (old or
new) and the older ones are complete too, so a kill during a write loses at
most the epoch being written. Where hard links are not supported, ``path`` is
renamed to ``path.1`` instead, and for a moment only ``path.1`` exists; resume
still finds it.

**Writers take turns.** Two processes checkpointing to one path (two jobs given the
same folder) write one after the other: each write and rotation holds an advisory lock
(``fcntl.flock``) on ``path + ".lock"``, a file that exists only during a write.

**Resume** tries ``path``, ``path.1``, ... in that order and takes the first
that loads (a file that does not load is skipped with a warning). A checkpoint
whose ``run`` differs from this run's is refused with an error naming the
difference: resuming another run's state would not be a continuation.

Example:
    >>> fd.fit(step, params, opt_state, batches, key, epochs=10, checkpoint="ckpt.pt",
    ...        resume=True)   # after a crash: continues from ckpt.pt (or ckpt.pt.1)
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import warnings
from collections.abc import Iterator
from typing import Any

from torch import Tensor

from ._td._atomic import FULL_ERRNOS as _FULL
from ._td._atomic import fsync_folder
from ._td._io import load, save
from ._td._tree import tree as fdtree

__all__ = ["Checkpoints", "Files", "run_fingerprint"]

FORMAT = 1  # the layout of the checkpoint dict; bumped when it changes
_KEYS = ("params", "opt_state", "epoch", "step", "history", "run")


def _layout(tree: Any) -> list[list[str]]:
    return [
        [".".join(map(str, p)) or "<root>", _describe(x)]
        for p, x in zip(fdtree.paths(tree), fdtree.leaves(tree))
    ]


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    return type(x).__name__


def run_fingerprint(params: Any, opt_state: Any, epochs: int, key: Any) -> dict[Any, Any]:
    """What identifies a run: the layout of ``params`` and ``opt_state`` (key paths,
    dtypes, shapes), ``epochs`` and the key's values."""
    if key is None:
        key_text = "None"
    else:
        key_text = f"{_describe(key)} {key.detach().cpu().reshape(-1).tolist()}"
    return {
        "format": FORMAT,
        "params": _layout(params),
        "opt_state": _layout(opt_state),
        "epochs": epochs,
        "key": key_text,
    }


def _difference(saved: Any, mine: dict[Any, Any]) -> str | None:
    """How the run that wrote a checkpoint differs from this one (None: the same)."""
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        return "it was not written by this version of fd.fit (no run fingerprint)"
    if saved["epochs"] != mine["epochs"]:
        return f"it is a run of epochs={saved['epochs']}, this one has epochs={mine['epochs']}"
    if saved["key"] != mine["key"]:
        return f"its key was {saved['key']}, this run's is {mine['key']}"
    for part in ("params", "opt_state"):
        there, here = dict(map(tuple, saved[part])), dict(map(tuple, mine[part]))
        for path, d in there.items():
            if path not in here:
                return f"its {part} have the key {path!r} ({d}), this run's do not"
            if here[path] != d:
                return f"at the {part} key {path!r}, it has {d} and this run has {here[path]}"
        for path, d in here.items():
            if path not in there:
                return f"this run's {part} have the key {path!r} ({d}), it does not"
    return None


class Files:
    """How checkpoints are written by default: one ``fd.save`` file each, by one process."""

    collective = False  # every rank takes part in a write (DCP) or only one
    folders = False  # a checkpoint is a folder

    def main(self) -> bool:
        return True

    def exists(self, name: str) -> bool:
        return os.path.exists(name)

    def save(self, state: dict[Any, Any], name: str) -> None:
        save(state, name)

    def load(self, name: str, map_location: Any) -> Any:
        return load(name, map_location=map_location)


class Checkpoints:
    """The rotating checkpoint files of one ``fit`` call (see the module docstring).

    ``store`` writes and reads one checkpoint: ``Files()`` (``fd.save`` files), or
    ``fd.distributed``'s DCP store for params that hold DTensors (each checkpoint a
    folder every rank writes its shards into; rank 0 rotates them)."""

    def __init__(
        self, where: str, path: str | os.PathLike[str], keep: int, store: Any = None
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"{where}: keep must be an int >= 1 (files kept), got {keep!r}.")
        self.where = where
        self.store = Files() if store is None else store
        self.path = os.fspath(path)
        self.names = [self.path] + [f"{self.path}.{j}" for j in range(1, keep)]
        self.loaded: str | None = None  # the file ``latest`` resumed from

    def problem(self) -> str | None:
        """Why checkpoints cannot be written here (None: they can)."""
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            return (
                f"the checkpoint folder {folder!r} does not exist; create it first "
                "(os.makedirs(folder, exist_ok=True))"
            )
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"the checkpoint folder {folder!r} is not writable"
        if os.path.isdir(self.path) and not self.store.folders:
            return f"the checkpoint path {self.path!r} is a folder; give a file name in it"
        return None

    def write(self, state: dict[Any, Any]) -> None:
        """Write ``state`` as the newest checkpoint and rotate the older ones.

        Processes writing the same path take turns (an advisory lock on
        ``path + ".lock"``, POSIX): each write and rotation is whole.

        Raises:
            OSError: the device is full or the file size limit reached (the message
                says which, with the path); the checkpoints already there are unchanged.
        """
        try:
            with _locked(self.path, self.store.collective):
                self._write(state)
        except OSError as e:
            if e.errno not in _FULL:
                raise
            raise OSError(
                e.errno,
                f"{self.where}: the checkpoint {self.path!r} could not be written: "
                f"{e.strerror} The checkpoints already written are unchanged; resume=True "
                "continues from the newest of them.",
            ) from e

    def _write(self, state: dict[Any, Any]) -> None:
        tmp = self.path + ".tmp"
        self.store.save(state, tmp)  # atomic and fsynced: complete before rotating
        if not self.store.main():  # DCP: the other ranks wrote their shards
            return
        for j in range(len(self.names) - 1, 1, -1):
            if os.path.exists(self.names[j - 1]):
                _move(self.names[j - 1], self.names[j])
        if len(self.names) > 1 and os.path.exists(self.path):
            self._keep_previous()
        _move(tmp, self.path)
        fsync_folder(os.path.dirname(os.path.abspath(self.path)))

    def _keep_previous(self) -> None:
        """``path.1`` = the current ``path``, which stays in place (a hard link)."""
        link = self.path + ".tmp1"
        try:
            if os.path.lexists(link):
                os.unlink(link)
            os.link(self.path, link)
            os.replace(link, self.names[1])
        except OSError:  # no hard links on this file system, or a folder: rename it
            _move(self.path, self.names[1])

    def latest(self, run: dict[Any, Any], map_location: Any = None) -> dict[Any, Any] | None:
        """The newest checkpoint that loads, checked against ``run``; None when
        there is none yet (a fresh start).

        Raises:
            ValueError: the newest loadable checkpoint is another run's.
        """
        for name in self.names:
            if not self.store.exists(name):
                continue
            try:
                state = self.store.load(name, map_location)
            except Exception as e:  # any unreadable file: try the one before
                warnings.warn(
                    f"{self.where}: the checkpoint {name!r} could not be loaded and is skipped "
                    f"({type(e).__name__}: {e}); resuming from an older one if there is one.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                continue
            self.loaded = name
            return self._checked(name, state, run)
        return None

    def _checked(self, name: str, state: Any, run: dict[Any, Any]) -> dict[Any, Any]:
        found = isinstance(state, dict) and all(k in state for k in _KEYS)
        diff = _difference(state.get("run") if found else None, run)
        if diff is not None:
            raise ValueError(
                f"{self.where}: refused to resume from {name!r}: it was written by another "
                f"run ({diff}). Resume only the run that wrote it; to start a new run, give "
                "another checkpoint path or remove the old files, or load the file with "
                "fd.load and pass its params to a new fit."
            )
        return state


@contextlib.contextmanager
def _locked(path: str, collective: bool) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path + ".lock"``, a file that exists only while
    a writer holds it (it is removed under the lock; a writer that locked a file
    already removed tries again, so two writers never hold two different files).
    Without ``fcntl`` (Windows), for collective stores (every rank writes a part) or
    where the file system refuses locks, nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    if collective:
        yield
        return
    name = path + ".lock"
    while True:
        fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits for the writer in progress, if any
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                raise
            yield  # a file system without locks: write unlocked, as before
            return
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(name))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder before removed this file: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
        os.close(fd)  # releases the lock


def _move(src: str, dst: str) -> None:
    """``os.replace``, also of a folder onto an older checkpoint folder."""
    if os.path.isdir(dst) and not os.path.islink(dst):
        shutil.rmtree(dst)
    os.replace(src, dst)

"""Crash-safe file replacement: write a temporary file, fsync it, ``os.replace`` it.

``atomic_write(path, write)`` calls ``write(f)`` on a new file in ``path``'s
folder, flushes and fsyncs it, renames it onto ``path`` (atomic on POSIX and
Windows) and fsyncs the folder, so the rename itself survives a power loss.
Whoever reads ``path`` at any moment sees the old file or the new one, whole.

Temporary files are named ``.<name>.fdsave-<host>-<pid>-<random>.tmp``. A
process killed while writing leaves its temporary file behind; the next
``atomic_write`` of the same path on the same host removes the ones whose
process is gone, before it writes its own (so kills that keep landing inside
writes never pile files up) and again after (POSIX only; a process still alive
is never disturbed). A full device, a spent quota or the file size limit is an
``OSError`` that says which, with the path (the old file stays, the temporary goes).

Example:
    >>> atomic_write("ckpt.pt", lambda f: torch.save(obj, f), "functd.save")
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import stat
from collections.abc import Callable
from typing import IO, Any

__all__ = ["FULL_ERRNOS", "atomic_write", "fsync_folder", "temp_prefix"]

_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:32] or "host"


def temp_prefix(path: str) -> str:
    """The name every temporary file of ``path`` starts with (inside its folder)."""
    return f".{os.path.basename(path)[:120]}.fdsave-{_HOST}-"


def atomic_write(path: str, write: Callable[[IO[bytes]], None], where: str) -> None:
    """Write ``path`` through ``write(f)`` so that a crash leaves the old file or the new.

    Raises:
        FileNotFoundError: the folder of ``path`` does not exist.
        IsADirectoryError: ``path`` is a folder (a symlink to a folder is replaced).
        OSError: the device is full (``ENOSPC``), the quota spent (``EDQUOT``) or the
            file size limit reached (``EFBIG``): the message says which, with the
            path; the old file is unchanged and the temporary file removed.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{where}({path!r}): the folder {folder!r} does not exist.")
    if os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(f"{where}({path!r}): this is a folder; give a file name.")
    mode = _mode_of(path)
    _sweep(folder, path)  # killed writers' leftovers go before this write needs the space
    tmp = os.path.join(folder, f"{temp_prefix(path)}{os.getpid()}-{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o666)
    watched = None
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                with contextlib.suppress(OSError, AttributeError):
                    os.fchmod(f.fileno(), mode)
            watched = _Watched(f)
            write(watched)  # type: ignore[arg-type]  # a file-like that forwards the rest
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        full = _no_space(e, watched)
        if full is not None:
            raise OSError(full.errno, _no_space_message(full, where, path)) from e
        raise
    fsync_folder(folder)
    _sweep(folder, path)


#: The errors of a write that ran out of room: a full device, a spent quota, the file
#: size limit (RLIMIT_FSIZE with SIGXFSZ ignored, or the file system's largest file).
FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


class _Watched:
    """The temporary file as ``write`` sees it, keeping the first ``OSError`` of a write
    (torch.save's writer turns it into its own ``RuntimeError: ... unexpected pos``,
    which names no cause)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str) -> Any:  # flush, fileno, tell, ...: the file's own
        return getattr(self.f, name)


def _no_space(e: BaseException, watched: _Watched | None) -> OSError | None:
    """The out-of-room OSError behind ``e`` (itself, its causes, or a write's), else None."""
    seen: list[BaseException | None] = [watched.error if watched is not None else None]
    cur: BaseException | None = e
    while cur is not None and len(seen) < 16:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for x in seen:
        if isinstance(x, OSError) and x.errno in FULL_ERRNOS:
            return x
    return None


def _no_space_message(e: OSError, where: str, path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    if e.errno == errno.EFBIG:
        cause = (
            "the file size limit was reached (EFBIG: this process's limit, `ulimit -f` / "
            "RLIMIT_FSIZE, or the largest file the file system holds)"
        )
        fix = "raise the limit or save to another file system"
    elif e.errno == errno.ENOSPC:
        cause = f"no space left on the device that holds {folder!r} (ENOSPC)"
        fix = "free some space or save elsewhere"
    else:
        cause = f"the disk quota on the device that holds {folder!r} is spent (EDQUOT)"
        fix = "free some space or save elsewhere"
    return (
        f"{where}({path!r}): {cause} while writing it. The file at the path is unchanged "
        f"(the partial temporary file was removed); {fix}, then save again."
    )


def _mode_of(path: str) -> int | None:
    """The permission bits of an existing regular file at ``path`` (not through a link)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. Windows, where a folder cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync folders (EINVAL)
        pass
    finally:
        os.close(fd)


def _sweep(folder: str, path: str) -> None:
    """Remove temporary files of ``path`` left by processes of this host that are gone."""
    if os.name != "posix":
        return
    prefix = temp_prefix(path)
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True
    return True

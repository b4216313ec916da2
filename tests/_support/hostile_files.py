"""A corpus of hostile files for ``fd.load``, written into a folder.

``build(folder)`` writes each case and returns ``[Case]``: the file, what
``fd.load`` must do (load ``value``, or raise ``error`` whose message matches
``says``) and the file's honest content in bytes (its size; for a case whose
archive is a valid checkpoint, the same). ``tests/test_io_hostile_files.py`` runs
them; ``python tests/_support/hostile_files.py`` prints every message and the peak
allocation of each case (tracemalloc + RSS) for notes/reliability.md.

The zip archives are written by ``_zip`` below (local headers, central
directory, end record), so a case can lie about sizes, offsets, names and
compression in ways ``zipfile`` refuses to write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

import functd as fd

_GOOD_ROWS = 256  # the valid checkpoint: 256 x 64 float32 (64 KB) and a nested entry


@dataclasses.dataclass
class Case:
    name: str
    path: Path
    error: type[BaseException] | None  # None: loads ``value``
    says: str = ""  # a regex the message must match
    value: Any = None
    honest: int = 0  # bytes of honest content: the file's size (at least 1); inflated
    # for the honestly deflated archive; the target's for a symlink


def good_td() -> fd.TensorDict:
    g = torch.Generator().manual_seed(0)
    return fd.TensorDict(
        {
            "x": torch.randn(_GOOD_ROWS, 64, generator=g),
            "n": {"y": torch.arange(_GOOD_ROWS), "z": torch.ones(_GOOD_ROWS, 2, 3)},
        },
        [_GOOD_ROWS],
    )


# ----------------------------------------------------------------- zip writing
@dataclasses.dataclass
class _Entry:
    name: str
    data: bytes  # the bytes as stored (compressed when method != 0)
    size: int  # declared uncompressed size
    crc: int
    method: int = zipfile.ZIP_STORED
    same_as: str | None = None  # no data of its own: point at that entry's header


def _entry(name: str, raw: bytes, method: int = zipfile.ZIP_STORED, level: int = 6) -> _Entry:
    data = raw
    if method == zipfile.ZIP_DEFLATED:
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        data = c.compress(raw) + c.flush()
    elif method == zipfile.ZIP_BZIP2:
        import bz2

        data = bz2.compress(raw)
    return _Entry(name, data, len(raw), zlib.crc32(raw), method)


def _zip(entries: list[_Entry]) -> bytes:
    out, central, offsets = bytearray(), bytearray(), {}
    for e in entries:
        name = e.name.encode()
        if e.same_as is None:
            offsets[e.name] = len(out)
            out += struct.pack(
                "<4s5H3L2H", b"PK\x03\x04", 20, 0, e.method, 0, 0, e.crc, len(e.data), e.size,
                len(name), 0,
            )  # fmt: skip
            out += name + e.data
        where = offsets[e.same_as or e.name]
        central += struct.pack(
            "<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, e.method, 0, 0, e.crc, len(e.data), e.size,
            len(name), 0, 0, 0, 0, 0, where,
        )  # fmt: skip
        central += name
    end = struct.pack(
        "<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), len(out), 0
    )
    return bytes(out + central + end)


def _members(blob: bytes) -> dict[str, bytes]:
    import io

    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _saved(obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _header_offset(blob: bytes, name: str) -> int:
    import io

    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return z.getinfo(name).header_offset


def _data_offset(blob: bytes, name: str) -> int:
    at = _header_offset(blob, name)
    n, m = struct.unpack("<2H", blob[at + 26 : at + 30])
    return at + 30 + n + m


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x10]) + blob[at + 1 :]


def _central_entry(blob: bytes, name: str) -> int:
    """Offset of ``name``'s entry in the central directory of ``blob``."""
    end = blob.rindex(b"PK\x05\x06")
    pos = struct.unpack("<L", blob[end + 16 : end + 20])[0]
    while blob[pos : pos + 4] == b"PK\x01\x02":
        n, m, k = struct.unpack("<3H", blob[pos + 28 : pos + 34])
        if blob[pos + 46 : pos + 46 + n].decode() == name:
            return pos
        pos += 46 + n + m + k
    raise KeyError(name)


def _sized_pickle(numel: int, shape_too: bool) -> tuple[str, dict[str, bytes]]:
    """The members of a saved ``{"x": uint8[12345]}`` TensorDict whose pickle declares a
    storage of ``numel`` bytes (and, with ``shape_too``, a tensor of that size)."""
    mem = _members(_saved(fd.TensorDict({"x": torch.zeros(12345, dtype=torch.uint8)}, [])))
    root = next(iter(mem)).split("/")[0]
    pkl = mem[f"{root}/data.pkl"]
    assert pkl.count(b"M90") == 2  # BININT2 12345: the storage's numel and the size
    big = b"J" + struct.pack("<i", numel)
    mem[f"{root}/data.pkl"] = pkl.replace(b"M90", big, 2 if shape_too else 1)
    return root, mem


class _Reduce:
    """Pickles as ``fn(*args)``: to write TensorDicts (and worse) with any arguments."""

    def __init__(self, fn: Any, args: tuple):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


# ----------------------------------------------------------------- the corpus
_TRUNCATED = r"begins as a zip archive but its end .* is missing or damaged.*truncated"
_CORRUPTED = r"member '.*{}' is corrupted: its CRC-32 checksum does not match"
_INTACT = r"the archive is intact \(its checksums verify\) but "


def build(folder: str | os.PathLike, bomb_mb: int = 256) -> list[Case]:
    """Write the corpus into ``folder``; ``bomb_mb``: the zip bomb's declared size."""
    folder = Path(folder)
    td = good_td()
    cases: list[Case] = []

    def add(
        name: str, blob: bytes | None, error=ValueError, says: str = "", value=None, honest=0
    ) -> Path:
        path = folder / f"{name}.pt"
        if blob is not None:
            path.write_bytes(blob)
        cases.append(Case(name, path, error, says, value, max(honest, len(blob or b""), 1)))
        return path

    good = _saved(td)
    add("good", good, None, value=td)
    _damaged(add, good)
    _forged_zips(add, good, td, bomb_mb)
    _forged_pickles(add, good, folder)
    _not_files(add, folder, td, len(good))
    return cases


def _damaged(add, good: bytes) -> None:
    """Truncations and flipped bytes of a valid checkpoint; random bytes."""
    mem = _members(good)
    root = next(iter(mem)).split("/")[0]
    pkl, d0 = f"{root}/data.pkl", f"{root}/data/0"
    add("empty", b"", says=r"the file is empty \(0 bytes\)")
    add("truncated_at_4", good[:4], says=_TRUNCATED)
    for frac in (0.1, 0.5, 0.9):
        add(f"truncated_at_{int(frac * 100)}pct", good[: int(len(good) * frac)], says=_TRUNCATED)
    add("truncated_end_record", good[:-22], says=_TRUNCATED)
    add("truncated_last_byte", good[:-1], says=_TRUNCATED)
    add("flip_in_data", _flip(good, _data_offset(good, d0) + 100), says=_CORRUPTED.format("data/0"))
    add(
        "flip_in_pickle",
        _flip(good, _data_offset(good, pkl) + 20),
        says=_CORRUPTED.format("data.pkl"),
    )
    add(
        "flip_in_central_crc",
        _flip(good, _central_entry(good, d0) + 16),
        says=_CORRUPTED.format("data/0"),
    )
    local = _header_offset(good, d0)
    add("flip_local_magic", _flip(good, local), says=r"header of member .*data/0' is damaged")
    add("flip_end_record", _flip(good, good.rindex(b"PK\x05\x06") + 2), says=_TRUNCATED)
    noise = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1))
    add("random_bytes", bytes(noise.to(torch.uint8).tolist()), says=r"is not a functd/torch file")
    add(
        "text",
        b"hello, this is not a checkpoint\n",
        says=r"starting with b'hello, t'\) is not a functd/torch file",
    )


def _forged_zips(add, good: bytes, td, bomb_mb: int) -> None:
    """Archives that lie about sizes, offsets, names or compression."""
    mem = _members(good)
    root = next(iter(mem)).split("/")[0]
    d0 = f"{root}/data/0"
    # a zip bomb: the pickle refers to bomb_mb MB of zeros, deflated about 230x
    n = bomb_mb << 20
    broot, bmem = _sized_pickle(n, shape_too=True)
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    chunk = bytes(1 << 20)
    zeros = b"".join([c.compress(chunk) for _ in range(bomb_mb)] + [c.flush()])
    crc = 0
    for _ in range(bomb_mb):
        crc = zlib.crc32(chunk, crc)
    bomb = [_entry(k, v) for k, v in bmem.items() if k != f"{broot}/data/0"]
    bomb.append(_Entry(f"{broot}/data/0", zeros, n, crc, zipfile.ZIP_DEFLATED))
    add(
        "zip_bomb",
        _zip(bomb),
        says=r"would expand to \d+ bytes .*in member .*data/0.*looks like a zip bomb",
    )
    # one 64 KB record named 16 more times (an overlap bomb)
    over = [_entry(k, v) for k, v in mem.items()]
    crc0 = zlib.crc32(mem[d0])
    over += [_Entry(f"{root}/data/{i}", b"", len(mem[d0]), crc0, same_as=d0) for i in range(9, 25)]
    add("overlapping_members", _zip(over), says=r"overlaps the member before it")
    huge = [_entry(k, v) for k, v in mem.items()]
    next(e for e in huge if e.name == d0).size = 0xFFFFFFF0  # 4 GB (the most without zip64)
    add(
        "huge_declared_size",
        _zip(huge),
        says=r"stored uncompressed in \d+ bytes but declares 4294967280",
    )
    short = [_entry(k, v) for k, v in mem.items()]
    next(e for e in short if e.name == d0).data = mem[d0][:100]
    add(
        "record_shorter_than_declared",
        _zip(short),
        says=r"data/0' is stored uncompressed in 100 bytes",
    )
    add(
        "duplicate_names",
        _zip([*(_entry(k, v) for k, v in mem.items()), _entry(d0, mem[d0])]),
        says=r"names \[.*data/0'\] more than once",
    )
    add(
        "bzip2_member",
        _zip([_entry(k, v, 12 if k == d0 else 0) for k, v in mem.items()]),
        says=r"compressed with zip method 12, which torch.load cannot read",
    )
    add(
        "deflated_honest",
        _zip([_entry(k, v, zipfile.ZIP_DEFLATED) for k, v in mem.items()]),
        None,
        value=td,
        honest=sum(len(v) for v in mem.values()),  # its content inflated
    )
    add(
        "nested_zip",
        _zip([_entry("ckpt.pt", good)]),
        says=r"a zip archive but not a torch file.*'ckpt.pt'.*unzip it",
    )
    add("zip_of_text", _zip([_entry("readme.txt", b"hi")]), says=r"not a torch file")
    add("empty_zip", _zip([]), says=r"an empty zip archive")
    buf = __import__("io").BytesIO()
    torch.save(td, buf, _use_new_zipfile_serialization=False)
    add(
        "legacy_format",
        buf.getvalue(),
        says=r"torch's legacy format .*weights_only=True\), new_path\)",
    )


def _forged_pickles(add, good: bytes, folder: Path) -> None:
    """Intact archives whose pickle is malformed, dangerous or describes nonsense."""
    mem = _members(good)
    root = next(iter(mem)).split("/")[0]
    pkl = f"{root}/data.pkl"
    bad = [_entry(k, b"\x80\x02\xff\xfe" if k == pkl else v) for k, v in mem.items()]
    add("malformed_pickle", _zip(bad), says=_INTACT + r"its pickle \(data.pkl\) is malformed")
    _, hmem = _sized_pickle(1 << 30, shape_too=False)
    add(
        "huge_numel_in_pickle",
        _zip([_entry(k, v) for k, v in hmem.items()]),
        says=_INTACT + r"torch.load could not rebuild .*RuntimeError",
    )
    marker = folder / "pwned.txt"
    code = _Reduce(os.system, (f"echo pwned > {marker}",))
    add(
        "global_os_system",
        _saved({"x": code}),
        pickle.UnpicklingError,
        r"refused the file.*nothing was run",
    )
    add(
        "td_wrong_batch",
        _saved(_Reduce(fd.TensorDict, ({"x": torch.zeros(2)}, [3]))),
        says=_INTACT + r"holds an invalid TensorDict, which was not built: ValueError: .*'x'",
    )
    add(
        "td_not_a_mapping",
        _saved(_Reduce(fd.TensorDict, ([1, 2], [3]))),
        says=_INTACT + r"holds an invalid TensorDict.*TypeError",
    )
    add(
        "td_too_many_args",
        _saved(_Reduce(fd.TensorDict, ({}, [], None, 4, 5))),
        says=_INTACT + r"torch.load could not rebuild .*TypeError",
    )
    storage = torch.zeros(4).untyped_storage()
    too_big = _Reduce(torch._utils._rebuild_tensor_v2, (storage, 0, (1 << 30,), (1,), False, {}))
    add(
        "tensor_bigger_than_storage",
        _saved({"x": too_big}),
        says=_INTACT + r"torch.load could not rebuild",
    )


def _not_files(add, folder: Path, td, good_size: int) -> None:
    """Paths that are not regular files; a symlink to a valid file."""
    os.mkfifo(add("fifo", None, says=r"this is a FIFO \(named pipe\), not a regular file"))
    add("folder", None, says=r"this is a folder").mkdir()
    loop = add("symlink_loop", None, says=r"a loop of symlinks")
    os.symlink(loop.name, loop)
    os.symlink("/dev/zero", add("device", None, says=r"this is a device, not a regular file"))
    os.symlink("good.pt", add("symlink_to_good", None, None, value=td, honest=good_size))


# ----------------------------------------------------------------- measuring
def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_kb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run(case: Case) -> tuple[Any, BaseException | None, int]:
    """``fd.load`` of the case: (value, error, peak bytes traced by tracemalloc)."""
    import tracemalloc

    tracemalloc.start()
    try:
        return fd.load(case.path), None, 0
    except Exception as e:
        return None, e, 0
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        run.peak = peak  # type: ignore[attr-defined]


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _reset_hwm() -> None:
    """Reset the peak RSS to the current RSS (Linux >= 4.0: /proc/self/clear_refs, "5")."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_bounds(folder: str) -> dict[str, int]:
    """For each file of the corpus in ``folder``: an upper bound (KB) of how much
    ``fd.load`` of it grew this process's RSS (its peak RSS during the load minus its
    RSS before; the peak is reset before each load), after one unmeasured pass over
    the corpus (the first C++ error torch raises costs about 3 MB once, for its
    backtrace). ``"control"``: the same for ``torch.load`` of ``zip_bomb.pt`` without
    functd's checks."""
    paths = sorted(Path(folder).glob("*.pt"))
    out = {}
    for measured in (False, True):
        for path in paths:
            _reset_hwm()
            before = _rss_kb()
            with contextlib.suppress(Exception):
                fd.load(path)
            if measured:
                out[path.stem] = _hwm_kb() - before
    _reset_hwm()
    before = _rss_kb()
    torch.load(Path(folder) / "zip_bomb.pt", weights_only=True)  # the unchecked loader inflates
    out["control"] = _hwm_kb() - before
    return out


def main() -> None:
    """Print every case's outcome, message, tracemalloc peak and RSS bound."""
    import json
    import subprocess
    import sys
    import tempfile

    if len(sys.argv) > 1 and sys.argv[1] == "--rss":
        print(json.dumps(rss_bounds(sys.argv[2])))
        return
    bomb_mb = int(os.environ.get("BOMB_MB", "1536"))
    with tempfile.TemporaryDirectory() as a:
        cases = build(a, bomb_mb)
        cmd = [sys.executable, __file__, "--rss", a]
        rss = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        print("| case | file bytes | outcome | tracemalloc peak | RSS bound |")
        print("|---|---|---|---|---|")
        for c in cases:
            _, err, _ = run(c)
            what = "loads the right value" if err is None else f"{type(err).__name__}: {err}"
            what = what.replace(str(c.path), "<path>").replace(str(a), "<folder>")
            print(f"| {c.name} | {c.honest} | {what[:160]} | {run.peak} | {rss[c.name]} KB |")
        print(f"control: torch.load of the bomb without checks: RSS +{rss['control']} KB")


if __name__ == "__main__":
    main()

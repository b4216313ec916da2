"""Verification of a torch zip archive before anything in it is unpickled.

``torch.save`` writes a zip archive of *stored* (uncompressed) members under
one root folder: ``<root>/data.pkl`` (the pickle), ``<root>/data/<n>`` (one
per tensor storage) and a few small records. ``torch.load`` reads it with
miniz built without CRC checks, trusting the sizes it declares. ``verify``
checks, reading the file in bounded chunks and allocating nothing in
proportion to what the archive *claims*:

- the file is a zip archive (else: empty, not a torch file, or truncated);
- its members have unique names under one root folder holding ``data.pkl``;
- every member lies inside the file and no two overlap (so the sizes it
  declares add up to at most the file's size: no "overlapping-member" bomb);
- a stored member's declared size is its stored size; compressed members
  (which torch.save never writes) use a method torch can read (deflate), and
  all members together expand at most ``MAX_RATIO`` times (plus 1 MiB);
- every member's CRC-32 matches its bytes (a flipped bit anywhere in the data
  or the pickle is caught here instead of loading as a wrong value).

Each failure raises a ``ValueError`` whose message starts with ``where``
(``functd.load('path')``), says what is wrong and what to do.

Example:
    >>> with open("ckpt.pt", "rb") as f:
    ...     verify(f, os.fstat(f.fileno()).st_size, "functd.load('ckpt.pt')")
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from typing import IO, Any

__all__ = ["MAX_RATIO", "pickle_member", "verify"]

#: Largest expansion allowed for the members of an archive: their declared sizes may add up
#: to MAX_RATIO times the archive's stored bytes, plus 1 MiB (torch.save compresses nothing;
#: weights deflate by less than 2x, a zip bomb by about 1000x).
MAX_RATIO = 8
_SMALL = 1 << 20
_CHUNK = 1 << 20
_LOCAL = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (30 bytes)
_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP = b"PK\x05\x06"
_LEGACY = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"  # torch's legacy (pre-1.6) format


def verify(f: IO[bytes], size: int, where: str) -> None:
    """Check the archive in ``f`` (``size`` bytes) as described in the module doc.

    Raises:
        ValueError: the file is empty, not a torch archive, truncated or damaged.
    """
    if size == 0:
        raise ValueError(
            f"{where}: the file is empty (0 bytes): nothing was saved there, or a write "
            "was interrupted before fd.save existed (fd.save replaces a file only once the "
            "new one is complete). Save it again."
        )
    f.seek(0)
    head = f.read(16)
    if not head.startswith(_ZIP_MAGIC):
        raise ValueError(_not_torch(where, size, head))
    try:
        zf = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise ValueError(
            f"{where}: the file ({size} bytes) begins as a zip archive but its end (the zip "
            "central directory) is missing or damaged: it is truncated (an interrupted "
            "write or copy) or damaged on disk. Use an intact copy. "
            f"(zipfile: {e})"
        ) from None
    with zf:
        infos = zf.infolist()
        _check_names(infos, where)
        for info, start in _check_layout(f, infos, zf.start_dir, where):
            _check_crc(f, info, start, where)


def pickle_member(f: IO[bytes]) -> bytes:
    """The bytes of ``<root>/data.pkl`` of an archive that ``verify`` accepted."""
    f.seek(0)
    with zipfile.ZipFile(f) as zf:
        name = next(i.filename for i in zf.infolist() if i.filename.endswith("/data.pkl"))
        return zf.read(name)


def _not_torch(where: str, size: int, head: bytes) -> str:
    if head.startswith(_EMPTY_ZIP):
        return f"{where}: the file is an empty zip archive, not a file written by fd.save."
    if head.startswith(_LEGACY):
        return (
            f"{where}: the file is in torch's legacy format (torch.save with "
            "_use_new_zipfile_serialization=False), which has no checksums, so fd.load does "
            "not read it. If you trust it, convert it once: "
            "torch.save(torch.load(path, weights_only=True), new_path)."
        )
    return (
        f"{where}: the file ({size} bytes, starting with {head[:8]!r}) is not a functd/torch "
        "file: fd.save and torch.save write a zip archive (starting with b'PK\\x03\\x04'). "
        "Check the path."
    )


def _check_names(infos: list[zipfile.ZipInfo], where: str) -> str:
    names = [i.filename for i in infos]
    if not names:
        raise ValueError(f"{where}: the zip archive has no members; it is not a torch file.")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(
            f"{where}: the zip archive names {dup[:3]} more than once, which torch.save never "
            "does (a reader may take either copy); the file was tampered with or damaged."
        )
    root = names[0].split("/", 1)[0]
    if any(not n.startswith(root + "/") for n in names) or f"{root}/data.pkl" not in names:
        shown = ", ".join(repr(n) for n in names[:5])
        raise ValueError(
            f"{where}: this is a zip archive but not a torch file: torch.save writes one "
            f"folder holding data.pkl, and this archive holds {shown}"
            f"{', ...' if len(names) > 5 else ''}. If it is a zip of a checkpoint, unzip it."
        )
    return root


def _check_layout(f: IO[bytes], infos: list[zipfile.ZipInfo], end: int, where: str) -> list[Any]:
    """Members inside [0, end) (the central directory starts at ``end``), one after the
    other, with declared sizes a reader can trust. Returns ``[(info, data offset)]``."""
    pos, out = 0, []
    for info in sorted(infos, key=lambda i: i.header_offset):
        name = info.filename
        if info.header_offset < pos:
            raise ValueError(
                f"{where}: member {name!r} overlaps the member before it in the zip archive "
                "(torch.save never writes that; it is how zip bombs repeat data): refused."
            )
        f.seek(info.header_offset)
        raw = f.read(_LOCAL.size)
        if len(raw) < _LOCAL.size or raw[:4] != _ZIP_MAGIC:
            raise ValueError(
                f"{where}: the header of member {name!r} is damaged (no zip local header at "
                f"offset {info.header_offset}); the file is damaged. Use an intact copy."
            )
        fields = _LOCAL.unpack(raw)
        start = info.header_offset + _LOCAL.size + fields[10] + fields[11]
        pos = start + info.compress_size
        if pos > end:
            raise ValueError(
                f"{where}: member {name!r} declares {info.compress_size} bytes, which run past "
                f"the archive's data (it ends at byte {end} of the file): the declared sizes "
                "are wrong; the file is damaged or forged. Refused before reading it."
            )
        _check_size(info, where)
        out.append((info, start))
    total = sum(i.file_size for i in infos)
    if total > MAX_RATIO * end + _SMALL:
        big = max(infos, key=lambda i: i.file_size)
        raise ValueError(
            f"{where}: the archive's {end} bytes of members would expand to {total} bytes "
            f"({total / max(end, 1):.0f}x; the limit is {MAX_RATIO}x), {big.file_size} of them "
            f"in member {big.filename!r} ({big.compress_size} bytes compressed). torch.save "
            "stores members uncompressed, so this looks like a zip bomb: refused before "
            "decompressing anything."
        )
    return out


def _check_size(info: zipfile.ZipInfo, where: str) -> None:
    name, size, stored = info.filename, info.file_size, info.compress_size
    if info.compress_type == zipfile.ZIP_STORED:
        if size != stored:
            raise ValueError(
                f"{where}: member {name!r} is stored uncompressed in {stored} bytes but "
                f"declares {size} bytes; the file is damaged or forged. Refused."
            )
        return
    if info.compress_type != zipfile.ZIP_DEFLATED:
        raise ValueError(
            f"{where}: member {name!r} is compressed with zip method {info.compress_type}, "
            "which torch.load cannot read (torch.save stores members uncompressed)."
        )


def _check_crc(f: IO[bytes], info: zipfile.ZipInfo, start: int, where: str) -> None:
    """Recompute the member's CRC-32 from its bytes (inflating a deflated member in
    bounded chunks, never past its declared size)."""
    f.seek(start)
    left, crc, size = info.compress_size, 0, 0
    inflate = None if info.compress_type == zipfile.ZIP_STORED else zlib.decompressobj(-15)
    try:
        while left:
            raw = f.read(min(left, _CHUNK))
            if not raw:
                break
            left -= len(raw)
            if inflate is None:
                crc, size = zlib.crc32(raw, crc), size + len(raw)
                continue
            while raw and size <= info.file_size:
                out = inflate.decompress(raw, _CHUNK)
                crc, size, raw = zlib.crc32(out, crc), size + len(out), inflate.unconsumed_tail
        if inflate is not None and size <= info.file_size:
            out = inflate.flush()  # what a match in progress still holds (< 300 bytes)
            crc, size = zlib.crc32(out, crc), size + len(out)
    except zlib.error as e:
        raise ValueError(
            f"{where}: member {info.filename!r} does not inflate ({e}); the file is "
            "damaged. Use an intact copy."
        ) from None
    if left or size != info.file_size or crc != info.CRC:
        raise ValueError(
            f"{where}: member {info.filename!r} is corrupted: its CRC-32 checksum does not "
            "match its bytes (a flipped or damaged byte, on disk or in transfer). Nothing was "
            "unpickled; use an intact copy."
        )

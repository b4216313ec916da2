"""``fd.save``/``fd.load`` of ``.safetensors`` files, and the flat naming they share with DCP.

A tree is written as torch's ``state_dict`` would name it: every tensor leaf under
its key path joined by dots (``params["0", "weight"]`` -> ``"0.weight"``; a list
item by its index), so ``safetensors.torch.load_file`` + ``nn.Module.load_state_dict``
read a functd params file, and ``fd.load`` of an HF ``model.safetensors`` gives the
nested params TensorDict that ``fd.from_module`` gives (its tied weights appear once,
under the name HF and functd both keep).

The file's metadata (string to string, as the format allows) holds:

- ``"format": "pt"`` (what HF's loaders expect);
- ``"functd"``: the tree as JSON: each node a TensorDict (its batch size and its keys
  in order), a dict, a list, a tuple, ``None``, a JSON scalar or a tensor (its flat
  name). ``fd.load`` rebuilds exactly that tree, keys with dots in them included. A
  file without it (written by another tool) loads as a nested TensorDict with batch
  size ``[]``, split at the dots;
- ``"functd.crc32"``: the CRC-32 of every tensor's bytes, checked by ``fd.load`` (a
  flipped byte is an error, not a wrong weight). Other readers ignore both.

The tensors are saved bitwise (every dtype safetensors has: the floats including
bfloat16 and float8, the signed and unsigned ints, bool, complex64); views,
non-contiguous and shared tensors are written as compact copies, GPU tensors from
the CPU. DTensors are refused (``fd.distributed.save`` writes sharded trees).
``flat_names``/``rebuild`` are the naming and its inverse, used by
``functd/distributed/_dcp.py`` too.

Example:
    >>> fd.save(params, "model.safetensors")
    >>> model.load_state_dict(safetensors.torch.load_file("model.safetensors"))
    >>> fd.testing.assert_close(fd.load("model.safetensors"), params)
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from typing import IO, Any

import torch

from ._atomic import atomic_write
from ._dtensor import is_dtensor
from ._tensordict import TensorDict

__all__ = ["flat_names", "is_safetensors", "load", "rebuild", "save", "tree_json"]

SUFFIX = ".safetensors"
META_TREE = "functd"
META_CRC = "functd.crc32"
_SCALARS = (bool, int, float, str)
#: The deepest nesting ``fd.load`` reads from a file's tree (or a tensor's dotted name);
#: deeper is refused as forged (real trees nest a few levels; Python's stack would not).
MAX_DEPTH = 100


def _require(where: str) -> Any:
    if importlib.util.find_spec("safetensors") is None:
        raise ModuleNotFoundError(
            f"{where}: .safetensors files need the safetensors package: "
            "`pip install safetensors` (or functd[safetensors]); fd.save(tree, 'x.pt') "
            "writes torch's format without it."
        )
    import safetensors.torch

    return safetensors.torch


# ------------------------------------------------------------------ the flat naming
def flat_names(obj: Any, where: str) -> tuple[dict[str, Any], dict[Any, Any]]:
    """``(tensors, tree)``: every tensor leaf of ``obj`` under its dotted name, and
    the JSON-able description of the tree that ``rebuild`` inverts.

    Raises:
        TypeError: ``obj`` is not a container, or holds a leaf of another type.
        ValueError: two leaves get the same dotted name (a key with a dot in it).
    """
    if not isinstance(obj, TensorDict | dict | list | tuple):
        raise TypeError(
            f"{where}: a flat file holds a tree of named tensors: give a TensorDict, a dict, "
            f"a list or a tuple, got a {type(obj).__name__} (wrap it: {{'x': value}})."
        )
    tensors: dict[str, Any] = {}
    paths: dict[str, tuple[Any, ...]] = {}
    tree = _describe(obj, (), tensors, paths, where)
    return tensors, tree


def _describe(
    x: Any, path: tuple[Any, ...], tensors: dict[Any, Any], paths: dict[Any, Any], where: str
) -> dict[Any, Any]:
    if isinstance(x, torch.Tensor):
        name = ".".join(path)
        if name in paths:
            raise ValueError(
                f"{where}: the key paths {paths[name]} and {path} both get the flat name "
                f"{name!r} (dots join the keys); rename the key that holds a dot."
            )
        paths[name] = path
        tensors[name] = x
        return {"t": "tensor", "name": name}
    if isinstance(x, TensorDict):
        items: list[Any] = [
            [k, _describe(v, (*path, k), tensors, paths, where)] for k, v in x._data.items()
        ]
        return {"t": "td", "batch": list(x.batch_size), "items": items}
    if isinstance(x, dict):
        for k in x:
            if not isinstance(k, str):
                raise TypeError(
                    f"{where}: at {_show(path)}, the dict key {k!r} is a {type(k).__name__}; "
                    "flat files name entries by str keys."
                )
        items = [[k, _describe(v, (*path, str(k)), tensors, paths, where)] for k, v in x.items()]
        return {"t": "dict", "items": items}
    if isinstance(x, list | tuple) and type(x) in (list, tuple):
        items = [_describe(v, (*path, str(i)), tensors, paths, where) for i, v in enumerate(x)]
        return {"t": type(x).__name__, "items": items}
    if x is None or type(x) in _SCALARS:
        return {"t": "value", "value": x}
    raise TypeError(
        f"{where}: at {_show(path)}, a {type(x).__name__} cannot be written to a flat file "
        "(it holds tensors, TensorDicts, dicts, lists, tuples, None, bools, ints, floats and "
        "strs); fd.save(tree, 'x.pt') writes torch's format."
    )


def _show(path: tuple[Any, ...]) -> str:
    if len(path) > 8:  # a forged file's deep path: its start and its depth
        return f"the key path {path[:4]}... ({len(path)} levels deep)"
    return "the root" if not path else f"the key path {path}"


def tree_json(tree: dict[Any, Any]) -> str:
    return json.dumps({"version": 1, "tree": tree}, separators=(",", ":"))


def rebuild(tree: Any, tensors: dict[str, Any], where: str) -> Any:
    """The tree ``flat_names`` described, with the tensors looked up by name.

    The description comes from a file, so every node is checked: a node of another
    shape, a batch size that is not a list of ints, a value that is not a JSON scalar
    or nesting deeper than ``MAX_DEPTH`` is a ``ValueError`` naming the key path
    (never a raw ``TypeError`` or ``RecursionError``).

    Raises:
        ValueError: the description is damaged or forged, or names a missing tensor.
    """
    return _rebuild(tree, tensors, where, ())


def _rebuild(tree: Any, tensors: dict[str, Any], where: str, path: tuple[Any, ...]) -> Any:
    if len(path) > MAX_DEPTH:
        raise _forged(where, path[:MAX_DEPTH], f"it nests deeper than {MAX_DEPTH} levels")
    kind = tree.get("t") if isinstance(tree, dict) else None
    if kind == "tensor":
        name = tree.get("name")
        if not isinstance(name, str):
            raise _forged(where, path, f"a tensor node names {_short(name)}, not a str")
        if name not in tensors:
            raise ValueError(f"{where}: the file's tree names the tensor {name!r}, which it lacks.")
        return tensors[name]
    if kind in ("td", "dict"):
        data = {k: _rebuild(v, tensors, where, (*path, k)) for k, v in _pairs(tree, where, path)}
        if kind == "dict":
            return data
        batch = tree.get("batch")
        if not isinstance(batch, list) or len(batch) > MAX_DEPTH:
            raise _forged(where, path, f"a TensorDict's batch size is {_short(batch)}")
        try:
            return TensorDict(data, batch_size=batch)
        except (TypeError, ValueError, OverflowError) as e:
            raise _forged(where, path, f"it is not a valid TensorDict ({e})") from None
    if kind in ("list", "tuple"):
        items = tree.get("items")
        if not isinstance(items, list):
            raise _forged(where, path, f"a {kind}'s items are {_short(items)}, not a list")
        out = [_rebuild(v, tensors, where, (*path, str(i))) for i, v in enumerate(items)]
        return out if kind == "list" else tuple(out)
    if kind == "value":
        value = tree.get("value")
        if value is not None and type(value) not in _SCALARS:
            raise _forged(where, path, f"a value node holds {_short(value)}")
        return value
    raise _forged(where, path, f"a node is {_short(tree)}")


def _pairs(tree: dict[Any, Any], where: str, path: tuple[Any, ...]) -> list[Any]:
    """The ``[key, node]`` items of a TensorDict or dict node, checked."""
    items = tree.get("items")
    if not isinstance(items, list):
        raise _forged(where, path, f"the items are {_short(items)}, not a list")
    for item in items:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise _forged(where, path, f"an item is {_short(item)}, not a [str key, node] pair")
    return items


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _forged(where: str, path: tuple[Any, ...], what: str) -> ValueError:
    return ValueError(
        f"{where}: the file's functd metadata (the tree it describes) is damaged or forged at "
        f"{_show(path)}: {what}. fd.save never writes that; use an intact copy of the file."
    )


def parse_tree(text: Any, where: str) -> Any:
    try:
        doc = json.loads(text)
        if doc.get("version") != 1:
            raise ValueError(f"version {doc.get('version')!r}")
        return doc["tree"]
    except RecursionError:
        raise _forged(where, (), "its JSON nests too deeply to be read") from None
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ValueError(
            f"{where}: the file's functd metadata is not one this version reads ({e})."
        ) from None


def nested(tensors: dict[str, Any], where: str) -> TensorDict:
    """A flat ``state_dict`` as a nested TensorDict of batch size ``[]`` (split at dots)."""
    root: dict[str, Any] = {}
    for name, t in tensors.items():
        *parents, last = name.split(".", MAX_DEPTH + 1)
        if len(parents) > MAX_DEPTH:
            raise ValueError(
                f"{where}: the tensor name {_short(name)} has more than {MAX_DEPTH} dotted "
                "parts, which no model has; the file is damaged or forged."
            )
        node = root
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(
                    f"{where}: {'.'.join(parents[: i + 1])!r} is a tensor and the prefix of "
                    f"{name!r}; such names do not form a tree."
                )
        if last in node:
            raise ValueError(f"{where}: {name!r} is a tensor and the prefix of other names.")
        node[last] = t
    return TensorDict(root, batch_size=[])


# ------------------------------------------------------------------ the files
def is_safetensors(path: str) -> bool:
    """Whether ``path`` (a regular file) looks like a safetensors file: its name, or
    its first bytes (an 8-byte header length, then a JSON object)."""
    if path.endswith(SUFFIX):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1


def _written(t: torch.Tensor, path: str, seen: set[Any], where: str) -> torch.Tensor:
    """The tensor as safetensors writes it: detached, on the CPU, compact, owning its bytes."""
    if is_dtensor(t):
        raise TypeError(
            f"{where}: {path!r} is a DTensor (a shard of a tensor on a device mesh); write "
            "sharded trees with fd.distributed.save(tree, folder), or gather them first: "
            "fd.save(fd.distributed.gather(params), path)."
        )
    if t.layout is not torch.strided or t.is_meta:
        raise TypeError(
            f"{where}: {path!r} is a {t.layout} tensor{' on meta' if t.is_meta else ''}; "
            "safetensors holds dense tensors with data."
        )
    x = t.detach().cpu()
    storage = x.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes())
    if (
        not x.is_contiguous()
        or storage.nbytes() != x.numel() * x.element_size()
        or (key in seen and x.numel())
    ):
        x = x.clone(memory_format=torch.contiguous_format)
    seen.add(key)
    return x


def _crc(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return zlib.crc32(t.reshape(-1).view(torch.uint8).numpy().data)


def save(obj: Any, path: str, where: str = "functd.save") -> None:
    """Write ``obj`` to ``path`` as a safetensors file, atomically (see the module doc)."""
    st = _require(where)
    tensors, tree = flat_names(obj, where)
    seen: set[Any] = set()
    out = {}
    for name, t in tensors.items():
        x = _written(t, name, seen, where)
        if x.dtype not in _dtypes(st):
            raise TypeError(
                f"{where}: {name!r} has dtype {x.dtype}, which the safetensors format does not "
                "hold; cast it, or write torch's format: fd.save(tree, 'x.pt')."
            )
        out[name] = x
    metadata = {
        "format": "pt",
        META_TREE: tree_json(tree),
        META_CRC: json.dumps({n: _crc(x) for n, x in out.items()}, separators=(",", ":")),
    }
    data = st.save(out, metadata=metadata)

    def write(f: IO[bytes]) -> None:
        f.write(data)

    atomic_write(path, write, where)


def _dtypes(st: Any) -> set[Any]:
    return set(st._TYPES.values()) if hasattr(st, "_TYPES") else set()


def load(path: str, map_location: Any = None, where: str | None = None) -> Any:
    """Read a safetensors file: the tree ``save`` wrote, or a nested TensorDict of a
    file another tool wrote; every CRC-32 in the metadata is checked first."""
    where = where or f"functd.load({path!r})"
    _require(where)
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except SafetensorError as e:
        raise ValueError(
            f"{where}: not a valid safetensors file (empty, truncated or damaged header): {e}"
        ) from None
    _verify(meta, tensors, where)
    if map_location is not None:
        if not isinstance(map_location, str | torch.device):
            raise TypeError(
                f"{where}: for a safetensors file, map_location is a device (a str or a "
                f"torch.device), got a {type(map_location).__name__}."
            )
        tensors = {n: t.to(map_location) for n, t in tensors.items()}
    if META_TREE in meta:
        return rebuild(parse_tree(meta[META_TREE], where), tensors, where)
    return nested(tensors, where)


def _verify(meta: dict[Any, Any], tensors: dict[Any, Any], where: str) -> None:
    if META_CRC not in meta:
        return
    damaged = f"{where}: the file's checksums (metadata {META_CRC!r}) are damaged or forged"
    try:
        crcs = json.loads(meta[META_CRC])
    except (ValueError, RecursionError):
        raise ValueError(f"{damaged}: they are not valid JSON. Use an intact copy.") from None
    if not isinstance(crcs, dict):
        raise ValueError(
            f"{damaged}: a JSON object of tensor names to CRC-32s was expected, got a "
            f"{type(crcs).__name__}. Use an intact copy."
        )
    for name, t in tensors.items():
        if name not in crcs:
            continue
        crc = crcs[name]
        if type(crc) is not int or not 0 <= crc < 1 << 32:
            raise ValueError(
                f"{damaged}: the CRC-32 of {name!r} is {_short(crc)}, not an int in "
                "[0, 2**32). Use an intact copy."
            )
        if crc != _crc(t):
            raise ValueError(
                f"{where}: the tensor {name!r} is damaged (its CRC-32 does not match the one "
                "written with it); the file was changed or corrupted after fd.save."
            )

"""fd.save / fd.load: round trips, torch's safe loader, refusal of pickled code; a view
saves only itself; truncated, foreign or tensordict-written files are named with the fix."""

import os
import pickle

import pytest
import torch

import functd as fd
from functd.testing import assert_close, example_tensordicts


def test_round_trip_nested_and_dtypes(tmp_path):
    path = tmp_path / "td.pt"
    for name, td in example_tensordicts().items():
        fd.save(td, path)
        back = fd.load(path)
        assert isinstance(back, fd.TensorDict), name
        assert back.keys(True) == td.keys(True), name
        assert_close(back, td)


def test_round_trip_many_dtypes(tmp_path):
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]  # fmt: skip
    td = fd.TensorDict({f"k{i}": torch.ones(3, 2, dtype=d) for i, d in enumerate(dtypes)}, [3])
    fd.save(td, tmp_path / "d.pt")
    back = fd.load(tmp_path / "d.pt")
    assert [v.dtype for v in back.values()] == dtypes
    assert_close(back, td)


def test_round_trip_dict_of_tensordicts(tmp_path):
    ex = example_tensordicts()
    obj = {"a": ex["nested"], "b": [ex["batch_2x3"], (ex["empty"], torch.arange(3))]}
    path = os.fspath(tmp_path / "many.pt")  # str paths work too
    fd.save(obj, path)
    back = fd.load(path)
    assert set(back) == {"a", "b"}
    assert_close(back, obj)
    assert back["b"][1][0].batch_size == torch.Size([])


def test_load_map_location(tmp_path):
    td = example_tensordicts()["nested"]
    fd.save(td, tmp_path / "td.pt")
    back = fd.load(tmp_path / "td.pt", map_location="meta")
    assert back.device == torch.device("meta")
    assert back.batch_size == td.batch_size


def test_nested_batch_sizes_survive(tmp_path):
    td = example_tensordicts()["longer_child"]
    fd.save(td, tmp_path / "td.pt")
    assert fd.load(tmp_path / "td.pt")["c"].batch_size == torch.Size([3, 2])


def test_torch_load_weights_only(tmp_path):
    td = example_tensordicts()["nested"]
    fd.save(td, tmp_path / "td.pt")
    back = torch.load(tmp_path / "td.pt", weights_only=True)
    assert isinstance(back, fd.TensorDict)
    assert_close(back, td)
    torch.save({"td": td}, tmp_path / "t.pt")  # and fd.load reads torch.save's files
    assert_close(fd.load(tmp_path / "t.pt")["td"], td)


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"echo pwned > {self.marker}",))


def test_load_refuses_pickled_code(tmp_path):
    marker = tmp_path / "pwned.txt"
    path = tmp_path / "evil.pt"
    torch.save({"td": example_tensordicts()["flat"], "x": Payload(marker)}, path)
    with pytest.raises(pickle.UnpicklingError, match=r"functd\.load\(.*evil\.pt.*refused"):
        fd.load(path)
    with pytest.raises(pickle.UnpicklingError, match=r"nothing was run.*weights_only=False"):
        fd.load(path)
    assert not marker.exists()


def test_payload_is_live(tmp_path):
    # the control: the same file does run its code with the unsafe loader
    marker = tmp_path / "pwned.txt"
    path = tmp_path / "evil.pt"
    torch.save(Payload(marker), path)
    torch.load(path, weights_only=False)
    assert marker.read_text().strip() == "pwned"


# ---------------------------------------------------------------- views, unreadable files, tensordict's TensorDict
def _td(n=2):
    return fd.TensorDict({"x": torch.randn(n, 3)}, [n])


def test_save_of_a_view_writes_only_the_view(tmp_path):
    big = torch.randn(1_000_000)
    td = fd.TensorDict({"v": big[:10], "w": big[500:520:2]}, [10])
    path = tmp_path / "view.pt"
    fd.save(td, path)
    assert os.path.getsize(path) < 10_000  # the whole storage would be 4 MB
    out = fd.load(path)
    assert_close(out, td)
    assert out["v"].untyped_storage().nbytes() == 40
    whole = tmp_path / "whole.pt"
    fd.save(fd.TensorDict({"v": big}, [1_000_000]), whole)  # a full tensor: unchanged
    assert os.path.getsize(whole) > 4_000_000
    assert big.shape == (1_000_000,) and td["v"].data_ptr() == big.data_ptr()  # nothing copied in


@pytest.mark.parametrize(
    ("cut", "says"),
    [
        (0, r"the file is empty \(0 bytes\)"),
        (11, r"is not a functd/torch file"),
        (100, r"begins as a zip archive but its end .* is missing.*truncated"),
        (-20, r"begins as a zip archive but its end .* is missing.*truncated"),
    ],
)
def test_load_truncated_or_foreign_file_names_it(tmp_path, cut, says):
    good = tmp_path / "good.pt"
    fd.save(_td(), good)
    data = good.read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"hello world" if cut == 11 else data[:cut])
    with pytest.raises(ValueError, match=r"load\('.*bad\.pt'\): (?s:.*)" + says):
        fd.load(bad)


def test_load_of_code_still_refused_as_before(tmp_path):
    path = tmp_path / "code.pt"
    torch.save({"f": os.getcwd}, path)
    with pytest.raises(pickle.UnpicklingError, match="safe loader"):
        fd.load(path)


def test_load_of_a_tensordict_memmap_folder_says_how_to_convert(tmp_path):
    tensordict = pytest.importorskip("tensordict")
    ref = tensordict.TensorDict({"a": torch.randn(3, 2), "n": {"b": torch.arange(3)}}, [3])
    for writer in ("memmap", "save"):
        folder = tmp_path / writer
        getattr(ref, writer)(folder)
        with pytest.raises(ValueError, match=r"tensordict's TensorDict\.memmap/save.*load_memmap"):
            fd.load(folder)
    # the conversion the message gives works as written
    t = tensordict.TensorDict.load_memmap(tmp_path / "memmap").clone()
    td = fd.TensorDict(t, batch_size=t.batch_size)
    assert type(td) is fd.TensorDict and type(td["n"]) is fd.TensorDict
    assert torch.equal(td["a"], ref["a"]) and torch.equal(td["n", "b"], ref["n", "b"])
    with pytest.raises(ValueError, match="this is a folder"):
        fd.load(tmp_path)


def test_load_of_a_torch_saved_tensordict_returns_an_fd_tensordict(tmp_path):
    tensordict = pytest.importorskip("tensordict")
    ref = tensordict.TensorDict({"a": torch.randn(3, 2), "n": {"b": torch.ones(3, 1)}}, [3])
    path = tmp_path / "td.pt"
    torch.save({"td": ref, "many": [ref, ref]}, path)
    out = fd.load(path)
    for td in (out["td"], *out["many"]):
        assert type(td) is fd.TensorDict and type(td["n"]) is fd.TensorDict
        assert td.batch_size == ref.batch_size
        assert torch.equal(td["a"], ref["a"]) and torch.equal(td["n", "b"], ref["n", "b"])
    with pytest.raises(TypeError, match="immutable"):
        out["td"]["a"] = 0

"""fd.save / fd.load: round trips, torch's safe loader, and refusal of pickled code."""

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

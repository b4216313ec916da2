"""`make gpu-check`'s plumbing on the CPU: it skips cleanly without CUDA; a step that
fails or hangs is reported and keeps the rows it measured; the targets' verdicts; the
JSON and markdown it writes. (The whole dry run, ``gpu_check.py --cpu``, takes a minute:
it is run by hand, not here.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_check.py")


def _load():
    if os.path.dirname(PATH) not in sys.path:  # its sibling modules (_cpu), as a script has
        sys.path.insert(0, os.path.dirname(PATH))
    spec = importlib.util.spec_from_file_location("gpu_check", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(id, value, ref=None, unit="µs"):
    return {"id": id, "label": id.replace(".", " "), "value": value, "unit": unit, "ref": ref}


def test_verdicts_met_missed_and_not_measured():
    g = _load()
    rows = [
        _row("prng.torch_normal_1024", 10.0),
        _row("prng.normal_1024", 29.0, "prng.torch_normal_1024"),  # 2.9x: met
        _row("prng.split", 31.0),  # above 30 µs: missed
        _row("block.hand", 100.0),
        _row("block.jit", 61.0, "block.hand"),  # 0.61x: missed
    ]
    got = {t["target"]: t for t in g.verdicts({r["id"]: r for r in rows})}
    assert len(got) == len(g.TARGETS)
    normal = got["eager fd.random.normal of 1,024 values <= 3x torch.randn"]
    assert normal["verdict"] == "met" and normal["measured"] == pytest.approx(2.9)
    assert got["fd.random.split <= 30 µs"]["verdict"] == "MISSED"
    assert got["tutorial block b1: fd.jit (default) <= 0.6x hand-written eager"]["verdict"] == (
        "MISSED"
    )
    assert got["fd.random.fold_in <= 30 µs"]["verdict"] == "not measured"


def test_write_gives_json_and_markdown(tmp_path):
    g = _load()
    rows = [_row("block.hand", 100.0), _row("block.jit", 50.0, "block.hand")]
    steps = [
        {"step": "cuda tests", "result": "ok", "seconds": 80.0, "note": "90 passed, 1 failed"},
        {"step": "block", "result": "TIMEOUT after 40 s", "seconds": 40.0, "note": "a | b"},
    ]
    steps[0]["failures"] = ["FAILED tests/test_x.py::test_y - boom"]
    report = {"machine": {"gpu": "H100", "date": "today", "driver": "580"}, "budget_s": 470}
    report.update(steps=steps, rows=rows, seconds=120.0)
    report["targets"] = g.verdicts({r["id"]: r for r in rows})
    jpath, mpath = g.write(report, str(tmp_path))
    with open(jpath) as f:
        assert json.load(f) == report
    with open(mpath) as f:
        md = f.read()
    assert md.startswith("# gpu-check: H100, today")
    assert "| block | TIMEOUT after 40 s | 40 | a / b |" in md  # a cell's "|" escaped
    assert "- `FAILED tests/test_x.py::test_y - boom`" in md
    assert "| block jit | 50 | µs | 0.50x block hand |" in md
    assert "| tutorial block b1: fd.jit (default) <= 0.6x hand-written eager | 0.5 x | met |" in md


def test_a_failing_or_hanging_step_is_reported_and_keeps_its_rows(tmp_path, monkeypatch):
    g = _load()
    log = str(tmp_path / "x.log")
    fail = [sys.executable, "-c", "print('trace'); raise SystemExit(3)"]
    assert g.execute(fail, 60, log) == "FAILED (rc 3)"
    with open(log) as f:
        assert f.read() == "trace\n"
    row = json.dumps(_row("block.hand", 1.0))
    hang = "import sys, time; open(sys.argv[1], 'a').write({!r} + '\\n'); print('x', flush=True); time.sleep(60)"
    monkeypatch.setattr(
        g, "step_argv", lambda name, rows: [sys.executable, "-c", hang.format(row), rows]
    )
    step = g.run_step("block", 2, str(tmp_path))
    assert step["result"] == "TIMEOUT after 2 s" and step["seconds"] < 30
    assert step["rows"] == [json.loads(row)] and step["note"] == "x"


def test_pytest_results_read_from_its_summary_or_from_its_verbose_lines():
    g = _load()
    stopped = [
        "tests/test_a.py::test_x PASSED  [  1%]",
        "tests/test_a.py::test_y[cuda] FAILED  [  2%]",
        "tests/test_b.py::test_z PASSED  [  3%]",
    ]
    assert g._progress(stopped) == "2 passed, 1 failed (before it stopped)"
    assert g._failures(stopped) == ["FAILED tests/test_a.py::test_y[cuda]"]
    done = [*stopped, "FAILED tests/test_a.py::test_y[cuda] - AssertionError: 1 != 2"]
    assert g._failures(done) == ["FAILED tests/test_a.py::test_y[cuda] - AssertionError: 1 != 2"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_skips_without_cuda():
    done = subprocess.run([sys.executable, PATH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "skipped: no CUDA device" in done.stdout

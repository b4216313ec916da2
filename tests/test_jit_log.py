"""fd.jit's compile log: off by default (functd's logger has a NullHandler and no
level); at INFO, a compile slower than ``SLOW_S`` logs when it starts and when it
ends (seconds, from disk or not). Slowness comes from a replaced clock, or from a
threshold lowered below a short sleep: no test waits seconds."""

from __future__ import annotations

import logging
import time

import pytest
import torch

import functd as fd
from functd._transforms import _jit_log


def _f(td):
    return td.set("y", td["x"] * 2)


def _td():
    return fd.TensorDict({"x": torch.ones(2, 3)}, [2])


def _slow_clock(monkeypatch, step: float = 3.0) -> None:
    """Each reading of the compile log's clock is ``step`` seconds after the last."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(_jit_log, "_clock", lambda: step * next(ticks))


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "functd.jit"]


def test_functd_logger_is_silent_by_default():
    logger = logging.getLogger("functd")
    assert logger.level == logging.NOTSET  # the level is the application's to set
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logging.getLogger("functd.jit").parent is logger


def test_a_slow_compile_logs_its_start_and_its_end(caplog, monkeypatch):
    _slow_clock(monkeypatch)
    caplog.set_level(logging.INFO, logger="functd")
    fd.jit(_f, backend="fx")(_td())
    start, end = _lines(caplog)
    assert start == "fd.jit(_f): compiling signature args[0]: TensorDict('x') batch [[2]] " + (
        "(float32[2, 3])..."
    )
    assert end.startswith("fd.jit(_f): compiled signature args[0]: TensorDict('x') batch [[2]]")
    assert end.endswith(" in 6.0 s (built, not from disk)")  # three readings, 3 s apart


def test_a_fast_compile_logs_nothing(caplog):
    caplog.set_level(logging.INFO, logger="functd")
    j = fd.jit(_f, backend="fx")
    j(_td())
    assert j.cache_info().compiles == 1 and _lines(caplog) == []


def test_nothing_is_logged_below_info(caplog, monkeypatch):
    _slow_clock(monkeypatch)
    caplog.set_level(logging.WARNING, logger="functd")
    fd.jit(_f, backend="fx")(_td())
    assert _lines(caplog) == []


def test_the_start_line_comes_while_the_compile_still_runs(caplog, monkeypatch):
    monkeypatch.setattr(_jit_log, "SLOW_S", 0.05)
    caplog.set_level(logging.INFO, logger="functd")
    seen = []

    def slow(td):
        time.sleep(0.3)  # the trace: the timer writes the start line meanwhile
        seen.append(list(_lines(caplog)))
        return _f(td)

    fd.jit(slow, backend="fx")(_td())
    assert len(seen[0]) == 1 and seen[0][0].startswith("fd.jit(slow): compiling signature")
    lines = _lines(caplog)
    assert len(lines) == 2 and lines[1].startswith("fd.jit(slow): compiled signature")


def test_a_long_signature_is_cut_in_the_log(caplog, monkeypatch):
    _slow_clock(monkeypatch)
    caplog.set_level(logging.INFO, logger="functd")
    td = fd.TensorDict({f"key{i}": torch.ones(2) for i in range(40)}, [2])
    fd.jit(lambda td: td.set("y", td["key0"] + 1), backend="fx")(td)
    start = _lines(caplog)[0]
    assert start.endswith("......") and len(start) < 240


def test_a_failed_compile_logs_that_it_failed(caplog, monkeypatch):
    _slow_clock(monkeypatch)
    caplog.set_level(logging.INFO, logger="functd")

    def bad(td):
        return td.set("y", torch.ones(3) * int(td["x"].sum()))  # a value in Python

    with pytest.raises(fd.TransformError, match="cannot be traced purely"):
        fd.jit(bad, backend="fx")(_td())
    assert _lines(caplog)[-1].startswith("fd.jit(bad): the compile failed after ")

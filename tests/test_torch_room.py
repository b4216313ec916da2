"""functd._torch's version gates: ``TORCH_VERSION`` and ``requires``."""

from __future__ import annotations

import pytest
import torch
from torch.torch_version import TorchVersion

from functd._torch import TORCH_VERSION, _parse, requires


def test_torch_version_matches_torchs_own_parse():
    v = TorchVersion(torch.__version__)
    # torch's own comparison of its version with a tuple brackets ours
    assert v >= TORCH_VERSION
    assert v < (TORCH_VERSION[0], TORCH_VERSION[1] + 1)


@pytest.mark.parametrize(
    "text, expected",
    [("2.13.0+cpu", (2, 13)), ("2.15.0a0+git1234", (2, 15)), ("3.0.1", (3, 0))],
)
def test_parse_reads_release_local_and_dev_builds(text, expected):
    assert _parse(text) == expected


def test_parse_refuses_an_unreadable_version():
    with pytest.raises(RuntimeError, match=r"functd: cannot read torch's version 'dev'"):
        _parse("dev")


def test_requires_is_silent_on_a_torch_that_has_the_feature():
    assert requires(TORCH_VERSION, "fd.scan") is None
    assert requires((TORCH_VERSION[0] - 1, 0), "fd.scan") is None


def test_requires_names_the_feature_and_both_versions():
    need = (TORCH_VERSION[0], TORCH_VERSION[1] + 1)
    with pytest.raises(RuntimeError) as e:
        requires(need, "fd.jit of fd.scan on the CPU")
    msg = str(e.value)
    assert msg.startswith(f"fd.jit of fd.scan on the CPU needs torch>={need[0]}.{need[1]};")
    assert f"this is torch {torch.__version__}" in msg
    assert "upgrade torch" in msg


def test_an_older_torch_gets_one_clear_import_error():
    """`import functd` on a torch older than the supported range (torch.__version__
    patched before the import, in a fresh interpreter) raises one ImportError naming the
    installed and the required versions; pyproject.toml declares the same range."""
    import subprocess
    import sys
    from pathlib import Path

    from functd._torch import NEWEST_TESTED, OLDEST

    code = "import torch; torch.__version__ = '2.10.0'\nimport functd"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last == (
        f"ImportError: functd needs torch>={OLDEST[0]}.{OLDEST[1]} (tested on "
        f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}); this Python has "
        f"torch 2.10.0. Upgrade torch: pip install 'torch>={OLDEST[0]}.{OLDEST[1]},"
        f"<{NEWEST_TESTED[0]}.{NEWEST_TESTED[1] + 1}'"
    ), run.stderr
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    declared = f"torch>={OLDEST[0]}.{OLDEST[1]},<{NEWEST_TESTED[0]}.{NEWEST_TESTED[1] + 1}"
    assert f'dependencies = ["{declared}",' in pyproject


def test_fd_jit_takes_inductors_python_wrapper_for_loops_where_the_cpp_one_cannot():
    """torch < 2.13 (``CPP_WRAPPER_LOOPS`` off, forced here): a graph with a loop op
    compiles with inductor's Python wrapper on the CPU; any other graph keeps the C++ one."""
    from functd._torch.hop import scan_op, while_loop_op
    from functd._transforms._jit_compile_options import uses_cpp_wrapper

    def graph(target):
        g = torch.fx.Graph()
        x = g.placeholder("x")
        g.output(g.call_function(target, (x,)))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    plain, scan, loop = graph(torch.ops.aten.sin.default), graph(scan_op), graph(while_loop_op)
    graphs = (plain, scan, loop)
    assert [uses_cpp_wrapper(gm, True, loops=True) for gm in graphs] == [True] * 3
    assert [uses_cpp_wrapper(gm, True, loops=False) for gm in graphs] == [True, False, False]
    assert not uses_cpp_wrapper(plain, False)  # a GPU graph: never the C++ wrapper

"""The package as a user gets it: tools/check_wheel.py builds the sdist and the wheel
(from the sdist), repairs the wheel to its ``cp310-abi3-manylinux_2_28`` tag, audits its
abi3 symbols, twine-checks both, installs the wheel in a fresh venv and runs the README
there.

Marked ``slow`` (about 2.5 minutes on the 2-core machine with pip's cache warm; more
the first time it downloads): it runs only with ``FUNCTD_SLOW=1`` (``make wheel-check``
runs the script directly)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_installs_and_runs_the_readme_in_a_fresh_venv(tmp_path):
    for tool in ("build", "twine", "auditwheel", "abi3audit"):
        if importlib.util.find_spec(tool) is None:
            pytest.skip(f"needs {tool}: pip install -e '.[release]'")
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_wheel.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "python blocks ran" in run.stdout and "-cp310-abi3-manylinux_2_28_" in run.stdout
    assert "functd 0." in run.stdout and "/venv/" in run.stdout

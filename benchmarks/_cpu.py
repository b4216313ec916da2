"""The CPU's model name, for the machine line of every benchmark (no torch import).

>>> isinstance(cpu_model(), str)
True
"""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """``model name`` from /proc/cpuinfo, else what ``platform`` knows."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        return cpu

"""Builds functd's two C extensions with the package (``pip install .``, ``pip install
-e .`` and ``python -m build`` all compile them): ``functd._fused_ext``, the fused CPU
kernels of ``functd.random``, and ``functd._td._alloc_ext``, a TensorDict built in one
call. Everything else is in pyproject.toml.

Plain C against the Python C API (no libtorch). Portable builds: no ``-march=native``;
the source compiles its hash loops once per instruction set and picks one at import.
No FMA contraction and no fast-math: the kernels' float steps must round exactly like
the pure torch-op path's (notes/prng.md).

Both use only CPython's limited API, the floor being the oldest Python functd supports
(requires-python >= 3.10): compiled with ``Py_LIMITED_API=0x030A0000`` into
``*.abi3.so`` files, in a wheel tagged ``cp310-abi3``, one wheel per platform serves
every CPython from 3.10 on. A free-threaded CPython (3.13t) has no limited API: there
the extensions are built for that one interpreter, as before.
"""

import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

UNIX_FLAGS = ["-O3", "-pthread", "-ffp-contract=off", "-fno-math-errno"]
MSVC_FLAGS = ["/O2", "/fp:precise"]


class BuildExt(build_ext):
    """Compiler flags by compiler family (gcc/clang or MSVC). Built in place (``pip
    install -e .``), an extension's other builds beside it are removed: Python imports
    ``_x.cpython-311-*.so`` before ``_x.abi3.so``, so a build from before abi3 would
    shadow the new one."""

    def build_extensions(self):
        msvc = self.compiler.compiler_type == "msvc"
        for ext in self.extensions:
            ext.extra_compile_args = MSVC_FLAGS if msvc else UNIX_FLAGS
            ext.extra_link_args = [] if msvc else ["-pthread"]
        super().build_extensions()

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        for ext in self.extensions:  # functd's packages live at their import paths
            built = Path(self.get_ext_filename(ext.name))
            stem = built.name.split(".", 1)[0]
            for other in (*built.parent.glob(f"{stem}.*.so"), *built.parent.glob(f"{stem}.*.pyd")):
                if other != built and built.exists():
                    other.unlink()


# the stable ABI: not on free-threaded builds, which do not offer it
ABI3 = not sysconfig.get_config_var("Py_GIL_DISABLED")
LIMITED = {"py_limited_api": True, "define_macros": [("Py_LIMITED_API", "0x030A0000")]}


def extension(name: str, source: str) -> Extension:
    return Extension(name, sources=[source], optional=True, **(LIMITED if ABI3 else {}))


# optional: where they cannot be compiled (no compiler), functd installs without them;
# functd.random warns once at the first draw, then draws the same bits with torch ops,
# and TensorDicts are built through the slot descriptors (same result, ~0.2 us slower)
setup(
    ext_modules=[
        extension("functd._fused_ext", "functd/_fused_ext.c"),
        extension("functd._td._alloc_ext", "functd/_td/_alloc_ext.c"),
    ],
    cmdclass={"build_ext": BuildExt},
    # the wheel's tag: cp310-abi3-<platform>
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if ABI3 else {},
)

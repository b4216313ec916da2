"""Builds functd's two C extensions with the package (``pip install .``, ``pip install
-e .`` and ``python -m build`` all compile them): ``functd._fused_ext``, the fused CPU
kernels of ``functd.random``, and ``functd._td._alloc_ext``, a TensorDict built in one
call. Everything else is in pyproject.toml.

Plain C against the Python C API (no libtorch). Portable builds: no ``-march=native``;
the source compiles its hash loops once per instruction set and picks one at import.
No FMA contraction and no fast-math: the kernels' float steps must round exactly like
the pure torch-op path's (notes/prng.md).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

UNIX_FLAGS = ["-O3", "-pthread", "-ffp-contract=off", "-fno-math-errno"]
MSVC_FLAGS = ["/O2", "/fp:precise"]


class BuildExt(build_ext):
    """Compiler flags by compiler family (gcc/clang or MSVC)."""

    def build_extensions(self):
        msvc = self.compiler.compiler_type == "msvc"
        for ext in self.extensions:
            ext.extra_compile_args = MSVC_FLAGS if msvc else UNIX_FLAGS
            ext.extra_link_args = [] if msvc else ["-pthread"]
        super().build_extensions()


# optional: where they cannot be compiled (no compiler), functd installs without them;
# functd.random warns once at the first draw, then draws the same bits with torch ops,
# and TensorDicts are built through the slot descriptors (same result, ~0.2 us slower)
setup(
    ext_modules=[
        Extension("functd._fused_ext", sources=["functd/_fused_ext.c"], optional=True),
        Extension("functd._td._alloc_ext", sources=["functd/_td/_alloc_ext.c"], optional=True),
    ],
    cmdclass={"build_ext": BuildExt},
)

"""Build script: one compiled extension, ``fastlayers.native._core`` (metadata: pyproject.toml).

The kernel files (``fastlayers/native/*.c`` included by ``kernels.inc``) are compiled once per
ISA, each through its ``isa_<name>.c`` with that ISA's flags only (no ``-march=native``, so a
wheel built on one x86-64 machine runs on any other); ``dispatch.c`` picks one at import from
CPUID. On other architectures only the portable path is built.
"""

import platform
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("fastlayers", "native")
#: Flags of every native object: -O3, math that keeps IEEE results (no reassociation; FMA
#: contraction allowed), C11 atomics.
COMMON = [
    "-O3",
    "-std=gnu11",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-fvisibility=hidden",
    "-Wall",
    "-Wno-unused-function",
]
ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "generic": [],
}


def native_isas():
    machine = platform.machine().lower()
    x86 = machine in ("x86_64", "amd64", "x64") and sys.platform != "win32"
    return ["avx512", "avx2", "generic"] if x86 else ["generic"]


class BuildExt(build_ext):
    """Compiles the per-ISA kernel objects and links them into the native extension."""

    def build_extension(self, ext):
        if ext.name == "fastlayers.native._core":
            depends = [str(p) for p in NATIVE.glob("*.[ch]")] + [str(p) for p in NATIVE.glob("*.inc")]
            objects = []
            for isa in native_isas():
                objects += self.compiler.compile(
                    [str(NATIVE / f"isa_{isa}.c")],
                    output_dir=self.build_temp,
                    include_dirs=[str(NATIVE)],
                    depends=depends,
                    extra_postargs=COMMON + ISA_FLAGS[isa],
                )
            ext.extra_objects = objects
            ext.depends = depends
        super().build_extension(ext)


def extensions():
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension

    core = Extension(
        "fastlayers.native._core",
        [
            str(NATIVE / "_core.pyx"),
            str(NATIVE / "dispatch.c"),
            str(NATIVE / "threadpool.c"),
            str(NATIVE / "heap.c"),
            str(NATIVE / "arena.c"),
            str(NATIVE / "plan.c"),
        ],
        include_dirs=[str(NATIVE), numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=COMMON,
        extra_link_args=["-pthread"],
    )
    return cythonize(
        [core],
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True, "initializedcheck": False},
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})

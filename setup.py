"""Build script: declares the Cython extensions (every ``fastlayers/**/_*.pyx``), with OpenMP
where the compiler supports it. Metadata lives in pyproject.toml."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup


def openmp_flags():
    """(-fopenmp, -fopenmp) when the C compiler accepts it, else no flags (serial kernels)."""
    if sys.platform == "win32":
        return ["/openmp"], []
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return [], []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "omp.c")
        src.write_text("#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n")
        ok = subprocess.run([cc, "-fopenmp", str(src), "-o", str(Path(tmp, "omp"))],
                            capture_output=True).returncode == 0
    return (["-fopenmp"], ["-fopenmp"]) if ok else ([], [])


def extensions():
    sources = sorted(Path("fastlayers").rglob("_*.pyx"))
    if not sources:
        return []
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension

    compile_args, link_args = openmp_flags()
    exts = [Extension(".".join(src.with_suffix("").parts), [str(src)],
                      depends=[str(h) for h in sorted(src.parent.glob("_*.h"))],
                      include_dirs=[numpy.get_include()],
                      extra_compile_args=["-O3", *compile_args], extra_link_args=link_args)
            for src in sources]
    return cythonize(exts, language_level=3, compiler_directives={
        "boundscheck": False, "wraparound": False, "cdivision": True, "initializedcheck": False})


setup(ext_modules=extensions())

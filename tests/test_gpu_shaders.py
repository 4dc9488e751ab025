"""The shipped SPIR-V (vkshmem/gpu/spv) matches the GLSL in shaders/ (vkshmem.gpu.shaders)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from vkshmem.core.errors import FeatureNotAvailableError
from vkshmem.gpu import shaders

pytestmark = pytest.mark.timeout(60)

needs_glslc = pytest.mark.skipif(shutil.which("glslc") is None,
                                 reason="glslc is not installed (apt-get install glslc): the "
                                        "shipped SPIR-V cannot be recompiled to compare")


def test_sources_and_manifest_agree_without_a_compiler() -> None:
    report = shaders.check(recompile=False)
    assert sorted(report.modules) == sorted(shaders.VARIANTS)


@needs_glslc
def test_shipped_spirv_is_what_glslc_makes_of_the_sources() -> None:
    report = shaders.check()
    assert sorted(report.modules) == sorted(shaders.VARIANTS)
    assert report.compiler


def _copies(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "shaders"
    spv = tmp_path / "spv"
    shutil.copytree(shaders.source_dir(), src)
    shutil.copytree(shaders.SPV_DIR, spv)
    return src, spv


def test_an_edited_shader_is_caught(tmp_path: Path) -> None:
    src, spv = _copies(tmp_path)
    inc = src / "vkshmem.glsl"  # an include counts too
    inc.write_text(inc.read_text() + "\n// edited\n")
    with pytest.raises(shaders.ShaderCheckError, match=r"ring_selftest: ring_selftest\.comp"):
        shaders.check(src, spv, recompile=False)


def test_a_tampered_module_is_caught(tmp_path: Path) -> None:
    src, spv = _copies(tmp_path)
    data = bytearray((spv / "amo_u64.spv").read_bytes())
    data[-4] ^= 1
    (spv / "amo_u64.spv").write_bytes(bytes(data))
    with pytest.raises(shaders.ShaderCheckError, match=r"amo_u64\.spv was changed"):
        shaders.check(src, spv, recompile=False)
    (spv / "stray.spv").write_bytes(bytes(data))
    with pytest.raises(shaders.ShaderCheckError, match="stray"):
        shaders.check(src, spv, recompile=False)


@needs_glslc
def test_recompilation_detects_a_stale_build(tmp_path: Path) -> None:
    """A module whose manifest was rewritten to hide an edit is still caught by recompiling."""
    src, spv = _copies(tmp_path)
    shaders.build(src, spv)  # same compiler: identical bytes
    for name in shaders.VARIANTS:
        assert (spv / f"{name}.spv").read_bytes() == \
            (shaders.SPV_DIR / f"{name}.spv").read_bytes()
    good = (spv / "copy_u32.spv").read_bytes()
    amo = src / "amo.comp"
    amo.write_text(amo.read_text().replace("case 4u: old = atomicAdd(w.v, x);",
                                           "case 4u: old = atomicAdd(w.v, x + WORD(1));"))
    shaders.build(src, spv)
    (spv / "amo_u64.spv").write_bytes((shaders.SPV_DIR / "amo_u64.spv").read_bytes())
    man = json.loads((spv / "manifest.json").read_text())
    man["modules"]["amo_u64"]["spv_sha256"] = hashlib.sha256(
        (spv / "amo_u64.spv").read_bytes()).hexdigest()
    (spv / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(shaders.ShaderCheckError, match="amo_u64: recompiling"):
        shaders.check(src, spv)
    assert (spv / "copy_u32.spv").read_bytes() == good


def test_normalize_ignores_debug_instructions_only() -> None:
    spv = (shaders.SPV_DIR / "reduce_f32.spv").read_bytes()
    words = bytearray(spv)
    words[8:12] = (0x12345678).to_bytes(4, "little")  # another generator
    # Append an OpName (opcode 5, 3 words: id 1, "a\0\0\0") after the header.
    opname = (3 << 16 | 5).to_bytes(4, "little") + (1).to_bytes(4, "little") + b"a\0\0\0"
    with_debug = bytes(words[:20]) + opname + bytes(words[20:])
    assert shaders.normalize(with_debug) == shaders.normalize(spv)
    other = (shaders.SPV_DIR / "reduce_f64.spv").read_bytes()
    assert shaders.normalize(other) != shaders.normalize(spv)  # code differences remain


def test_check_without_sources_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FeatureNotAvailableError, match="GLSL sources"):
        shaders.check(tmp_path / "nowhere")

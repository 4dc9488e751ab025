#!/usr/bin/env bash
# Builds libfabric's own one-sided benchmarks (fabtests: fi_rma_pingpong, fi_rma_bw,
# fi_rdm_atomic, fi_rdm_pingpong) against the system libfabric, for bench_ofi.py.
#
# Debian 12 packages no fabtests, and fi_rma_pingpong first appeared in fabtests 1.21, so this
# compiles the fabtests of a libfabric 1.21.0 source tree against Debian's libfabric 1.17
# headers, with three shims (none touches what is measured): the API version asked of
# fi_getinfo is 1.17, the dma-buf MR fields (1.20+) are stubbed out, fi_hmem_ze_device (not
# in 1.17's library) returns 0. No autotools needed.
#
#   git clone --branch v1.21.0 --depth 1 <libfabric repository> /tmp/libfabric
#   bash plugins/ofi/tools/build_fabtests.sh /tmp/libfabric /tmp/fabtests
#   .venv/bin/python plugins/ofi/tools/bench_ofi.py --fabtests /tmp/fabtests
set -euo pipefail
src=${1:?usage: build_fabtests.sh <libfabric 1.21 source tree> <output dir>}
out=${2:?usage: build_fabtests.sh <libfabric 1.21 source tree> <output dir>}
[ -f "$src/fabtests/benchmarks/rma_pingpong.c" ] || {
    echo "build_fabtests: $src/fabtests/benchmarks/rma_pingpong.c not found (libfabric >= 1.21 sources needed)" >&2
    exit 1
}
mkdir -p "$out"
rm -rf "$out/src"
cp -r "$src/fabtests" "$out/src"
cd "$out/src"
cat > config.h <<'EOF'
/* build_fabtests.sh: what configure would say here, and libfabric 1.17 compatibility */
#define HAVE___INT128 1
#define HAVE_CLOCK_GETTIME 1
#define PACKAGE_VERSION "1.21.0-on-system-libfabric"
#include <stdint.h>
#include <stddef.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#ifndef FI_MR_DMABUF
struct fi_mr_dmabuf { int fd; uint64_t offset; size_t len; void *base_addr; };
#define FI_MR_DMABUF (1ULL << 40)
#endif
#ifndef FI_PROGRESS_CONTROL_UNIFIED
#define FI_PROGRESS_CONTROL_UNIFIED 3
#endif
EOF
echo 'int fi_hmem_ze_device(int driver, int device) { (void)driver; (void)device; return 0; }' \
    > compat_ze.c
sed -i 's/#define FT_FIVERSION FI_VERSION(1,[0-9]*)/#define FT_FIVERSION FI_VERSION(1,17)/' \
    include/shared.h
sed -i 's/^\t\tattr->dmabuf = dmabuf;/\t\t(void)dmabuf;/' common/shared.c
common="common/shared.c common/hmem.c common/hmem_cuda.c common/hmem_rocr.c common/hmem_ze.c
        common/hmem_neuron.c compat_ze.c"
flags="-O2 -D_GNU_SOURCE -DHAVE_CONFIG_H -I. -Iinclude -Iinclude/unix"
for b in rma_pingpong rma_bw rdm_pingpong; do
    # shellcheck disable=SC2086
    gcc $flags -o "$out/fi_$b" "benchmarks/$b.c" benchmarks/benchmark_shared.c $common \
        -lfabric -ldl -lpthread -lm
done
# shellcheck disable=SC2086
gcc $flags -o "$out/fi_rdm_atomic" functional/rdm_atomic.c $common -lfabric -ldl -lpthread -lm
echo "build_fabtests: built $(cd "$out" && echo fi_*) in $out"

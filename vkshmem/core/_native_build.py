"""cffi (API mode) build of the core's native helper ``vkshmem.core._native``.

Every entry point checks its own arguments (segment id, PE index, offset and size against the
segment, AMO width and alignment) before it touches memory: a bad call returns an error code
(or records one for ``vk_last_error``) instead of reading or writing outside a mapping, even
when the Python layer that normally checks first is bypassed.
"""

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).parent

CDEF = """
uint64_t vk_amo(uintptr_t addr, int op, int width, uint64_t operand, uint64_t compare);
void vk_fence(void);
int vk_table_init(int npes, int nsegs);
int vk_set_local(int seg, uintptr_t base, uint64_t size);
int vk_set_peer(int seg, int pe, uintptr_t base);
int64_t vk_locate(const void *p, uint64_t nbytes);
int vk_track(int seg);
void vk_mark_live(int seg, uint64_t off, uint64_t n, int live);
int vk_shm_put(int seg, int pe, uint64_t off, const void *src, uint64_t n);
int vk_shm_get(int seg, int pe, uint64_t off, void *dst, uint64_t n);
uint64_t vk_shm_amo(int seg, int pe, uint64_t off, int op, int width,
                    uint64_t operand, uint64_t compare);
uintptr_t vk_peer_base(int seg, int pe);
void vk_copy_stream(void *dst, const void *src, uint64_t n);
int vk_spin_change(const void *addr, const void *snapshot, uint64_t n, uint64_t max_ns);
int vk_proxy_due(const uint64_t *bells, uint64_t *next, int n, int depth, uint64_t *out,
                 int max, uint64_t max_ns);
uintptr_t vk_amo_address(void);
uintptr_t vk_table_address(void);
int vk_direct_put(const void *target, const void *src, uint64_t n, int pe);
int vk_direct_get(void *dst, const void *source, uint64_t n, int pe);
uint64_t vk_direct_amo(const void *target, int pe, int op, int width, uint64_t operand,
                       uint64_t compare);
int vk_last_error(void);
#define VK_SENTINEL ...
struct vk_domain_ops { void *self; uint64_t size; uint8_t *mapped; uint64_t write_max, read_max;
                       ...; };
struct vk_native_ops { void *self; ...; };
struct vk_proxy {
    uint64_t *bells;
    uint64_t *next;
    uint64_t *due;
    uint64_t *answer;
    uint64_t *ranges;
    uint8_t **peer;
    struct vk_native_ops **route;
    uint8_t *direct;
    struct vk_domain_ops *dom;
    uint64_t base;
    uint64_t answers, blocks, area, chunk;
    int n, depth, me;
    uint64_t rounds, requests, direct_pieces, max_round, answer_errors, mapped_sends;
};
int vk_proxy_serve(struct vk_proxy *p, uint64_t max_ns);
void vk_mapped_domain_ops(struct vk_domain_ops *ops, uintptr_t base, uint64_t size);
"""

#: the C source (csrc/native.c includes csrc/proxy_round.c)
SOURCE = (HERE / "csrc" / "native.c").read_text()

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("vkshmem.core._native", SOURCE,
                      include_dirs=[str(HERE), str(HERE / "csrc")],
                      extra_compile_args=["-O2"])

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)

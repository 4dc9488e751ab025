/* The functions of cudasvc.c, as cffi's cdef reads them (vkshmem_cuda/_ops_build.py). */
typedef struct vkc_svc vkc_svc;
vkc_svc *vkc_svc_new(uintptr_t ctx, uintptr_t stream, uintptr_t fn, uintptr_t req,
                     uint64_t req_dev, uintptr_t rep, uint64_t rep_dev, unsigned threads,
                     uint64_t idle_ns, int64_t spin_ns);
int vkc_svc_call(vkc_svc *s, int op, int width, uint64_t dst, uint64_t src, uint64_t nbytes,
                 uint64_t operand, uint64_t compare, uintptr_t host_in, uintptr_t host_out,
                 uint64_t *result, int64_t timeout_ns);
int vkc_svc_park(vkc_svc *s);
int vkc_svc_stop(vkc_svc *s, int64_t timeout_ns);
uint64_t vkc_svc_launches(vkc_svc *s);
void vkc_svc_free(vkc_svc *s);
#define VKC_SVC_TIMEOUT 1100
#define VKC_SVC_BROKEN 1101

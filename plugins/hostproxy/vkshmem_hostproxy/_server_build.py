"""cffi (API mode) build of the hostproxy's native parts, ``vkshmem_hostproxy._server``.

The C sources live in ``csrc/``, built as one translation unit: ``hp_server.c`` and
``hp_loop.c`` (the server thread: a connection's requests; the epoll loop and the server's
lifetime), ``hp_conn.c`` and ``hp_client.c`` (the client: every request a PE sends, from Python
or from the core's compiled hot path; its declarations are read from ``hp_client.h``) and
``hp_auth.c`` (HMAC-SHA256 for the handshake that admits peers). It includes vkshmem's
``vkshmem/plugin.h`` (``struct vk_native_ops``, the ``vk_amo_fn`` type, the AMO op codes and
the ``VK_ST_*`` statuses), found through the plugin kit (``vkshmem.plugin.get_include``):
vkshmem is a build requirement.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

# vkshmem is a build requirement (pyproject.toml): the plugin compiles against its header
from vkshmem.plugin import get_include, header_cdef, plugin_cdef

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"


CDEF = """
#define HP_REQ_SIZE ...
#define HP_REP_SIZE ...
#define HP_MAX_SEGS ...
#define HP_ERRLEN ...
#define HP_VERSION ...
#define HP_MAGIC ...
#define HP_OP_HELLO ...
#define HP_OP_PUT ...
#define HP_OP_GET ...
#define HP_OP_AMO ...
#define HP_OP_AMO_FETCH ...
#define HP_OP_FLUSH ...
#define HP_OP_CLOSE ...
#define HP_OK ...
#define HP_OP_AUTH ...
#define HP_NONCE ...
#define HP_MAC ...
#define HP_KEY ...
#define HP_AUTH_MS ...
#define HP_MAX_PENDING ...

typedef struct hp_server hp_server;
hp_server *hp_create(int listen_fd, int32_t my_pe, int32_t n_pes, const unsigned char *key,
                     uintptr_t amo_fn, uint32_t spin_us, uint32_t request_ms, uint32_t max_conns,
                     char *err, size_t errlen);
void hp_mac(const unsigned char *key, const unsigned char *label, size_t label_len,
            const unsigned char *nc, const unsigned char *ns, uint32_t client_pe,
            uint32_t server_pe, unsigned char *out);
int hp_register(hp_server *s, uint32_t seg, uintptr_t base, uint64_t size);
void hp_stats(hp_server *s, uint64_t *out);
uint64_t hp_last_error(hp_server *s, char *buf, size_t buflen);
void hp_destroy(hp_server *s);

extern "Python" int _hpc_signalled(void);
"""


ffibuilder = FFI()
ffibuilder.cdef(plugin_cdef() + CDEF + header_cdef(CSRC / "hp_client.h"))
ffibuilder.set_source(
    "vkshmem_hostproxy._server",
    "".join((CSRC / f).read_text()
            for f in ("hp_server.c", "hp_loop.c", "hp_auth.c", "hp_conn.c", "hp_client.c")),
    include_dirs=[str(CSRC), get_include()],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)

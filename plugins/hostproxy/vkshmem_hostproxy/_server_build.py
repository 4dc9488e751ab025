"""cffi (API mode) build of the hostproxy's native parts, ``vkshmem_hostproxy._server``.

The C sources live in ``csrc/``, built as one translation unit: ``hp_server.c`` and
``hp_loop.c`` (the server thread: a connection's requests; the epoll loop and the server's
lifetime), ``hp_conn.c`` and ``hp_client.c`` (the client: every request a PE sends, from Python
or from the core's compiled hot path; its declarations are read from ``hp_client.h``) and
``hp_auth.c`` (HMAC-SHA256 for the handshake that admits peers). It needs the core's
``_native.h`` (the ``vk_amo_fn`` type and AMO op codes): found next to an importable
``vkshmem`` package, or in the vkshmem source tree this plugin sits in (``plugins/hostproxy``
of the vkshmem repository), which is what an isolated ``pip install`` of the in-tree plugin
sees.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from cffi import FFI

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
#define HP_EPROTO ...
#define HP_ESEG ...
#define HP_EBOUNDS ...
#define HP_EALIGN ...
#define HP_EAMO ...
#define HP_EHELLO ...
#define HP_EAUTH ...
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


def header_cdef(path: Path) -> str:
    """The declarations of a C header as cffi's cdef takes them: comments, include guards and
    includes dropped, each ``#define NAME value`` as ``#define NAME ...``, and struct forward
    declarations given as structs of unknown layout (cffi learns it when compiling)."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    out = []
    for line in text.splitlines():
        if line.startswith(("#ifndef", "#endif", "#include")) or re.fullmatch(r"#define \w+_H",
                                                                              line):
            continue
        if m := re.match(r"#define (\w+) ", line):
            line = f"#define {m[1]} ..."
        elif m := re.match(r"struct (\w+);$", line):
            line = f"struct {m[1]} {{ ...; }};"
        out.append(line)
    return "\n".join(out)


def core_include_dir() -> str:
    """The directory holding vkshmem's ``_native.h``."""
    candidates = []
    spec = importlib.util.find_spec("vkshmem")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "core" for p in spec.submodule_search_locations]
    candidates.append(HERE.parents[2] / "vkshmem" / "core")  # the vkshmem source tree
    for path in candidates:
        if (path / "_native.h").is_file():
            return str(path)
    raise RuntimeError(
        "vkshmem-hostproxy: cannot find vkshmem's _native.h (looked in "
        + ", ".join(map(str, candidates))
        + "); install vkshmem first and build with --no-build-isolation"
    )


ffibuilder = FFI()
ffibuilder.cdef(CDEF + header_cdef(CSRC / "hp_client.h"))
ffibuilder.set_source(
    "vkshmem_hostproxy._server",
    "".join((CSRC / f).read_text()
            for f in ("hp_server.c", "hp_loop.c", "hp_auth.c", "hp_conn.c", "hp_client.c")),
    include_dirs=[str(CSRC), core_include_dir()],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)

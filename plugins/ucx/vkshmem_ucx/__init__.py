"""vkshmem-ucx: the ``ucx`` transport (UCP put/get/atomics, with a native progress thread).

Registered through the entry point group ``vkshmem.transports``; the core opens it per rail,
e.g. ``VKSHMEM_TRANSPORTS=ucx`` or ``VKSHMEM_RAIL0=ucx:tls=tcp,self:dev=eth0``. See
``README.md`` for the options and the UCX variables that matter.

Importing this package does not load UCX: the spec is always offered (so ``vkshmem info``
lists it), and the native module is loaded when the transport is first opened. A UCX that
cannot load then fails with a :class:`~vkshmem.plugin.TransportError` that says what to
install.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import RMA, AmoOp, TransportContext, TransportError, TransportSpec, hookimpl

from ._access import TRUST_VAR

if TYPE_CHECKING:
    from ._transport import UcxTransport

__all__ = ["NAME", "OPTIONS", "SPEC", "load_native", "open_transport", "register_transports"]

NAME = "ucx"
#: Rail options this transport understands (plus ``UCX_<NAME>=value`` for any UCX variable).
OPTIONS = ("tls", "dev", "atomic", "timeout", "spin", "wait_spin", "errmode", "selftest",
           "heap", "direct", "domain_amo", "trusted")


def _skip_memory_hooks() -> None:
    """UCX's memory-event hooks (UCM patching mmap/munmap/malloc at load) cost ~0.4 s per
    process; they serve UCX's registration cache for RDMA NICs and its memory-type cache for
    GPU memory. On a host with neither an RDMA device nor an NVIDIA GPU they do nothing for
    vkshmem (its segments are registered once): there UCX_MEM_EVENTS=no, unless it is set."""
    if "UCX_MEM_EVENTS" in os.environ:
        return
    rdma = os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))
    if not rdma and not os.path.exists("/dev/nvidia0"):
        os.environ["UCX_MEM_EVENTS"] = "no"


def load_native() -> Any:
    """The native module ``vkshmem_ucx._ucx`` (loading UCX), or a TransportError that says
    what to install."""
    _skip_memory_hooks()
    try:
        from . import _ucx
    except ImportError as first:
        try:  # a layout the rpath does not cover: let the wheel's loader find its libraries
            import libucx

            libucx.load_library()
            from . import _ucx
        except ImportError:
            raise TransportError(
                NAME, f"cannot load UCX ({first}). Install the UCX wheel (`pip install "
                "libucx-cu12`), or Debian's UCX (`apt-get install libucx0`) if vkshmem-ucx was "
                "built with VKSHMEM_UCX_PREFIX=/usr, then reinstall vkshmem-ucx") from None
    return _ucx


def open_transport(context: TransportContext) -> UcxTransport:
    """The spec's factory: open the ucx transport for one rail (loads UCX on first use)."""
    load_native()
    from ._transport import UcxTransport, check_library

    check_library()  # an older UCX loaded first (an MPI's own) would crash now and then
    return UcxTransport(context)


SPEC = TransportSpec(
    name=NAME,
    factory=open_transport,
    priority=50,
    # CUDA device memory (the cuda domain's heap): puts and gets; its AMOs go through the
    # domain's proxy (UCX's software atomics would apply them with CPU instructions)
    memory_kinds=frozenset({"host", "cuda_va"}),
    kind_ops={"cuda_va": frozenset({RMA})},
    reach=frozenset({"intra", "inter"}),
    amo_ops=frozenset(AmoOp),
    amo_widths=frozenset({4, 8}),
    native_fence=True,
    put_signal=False,
    description="UCX (UCP) one-sided put/get/atomics over whatever UCX reaches (shared memory, "
                "InfiniBand/RoCE with a verbs-enabled UCX; tcp only on a trusted network); "
                "native progress thread",
    variables=((TRUST_VAR, "0", "1: every process that can reach the "
                "rails' network and the user's group is trusted, so UCX's tcp and sysv "
                "transports (which check no remote key / make 0660 segments) may be opened; "
                "0 leaves them out (the rail option trusted= overrides it per rail)."),),
)


@hookimpl
def register_transports(register: Callable[[Any], None]) -> None:
    """Offer the ``ucx`` transport."""
    register(SPEC)

"""vkshmem-ofi: the ``ofi`` transport (libfabric RDM put/get/atomics, native progress thread).

Registered through the entry point group ``vkshmem.transports``; the core opens it per rail,
e.g. ``VKSHMEM_TRANSPORTS=ofi`` or ``VKSHMEM_RAIL0=ofi:provider=shm``. The provider comes from
the rail option ``provider=``, else ``VKSHMEM_OFI_PROVIDER``, else ``tcp;ofi_rxm``. See
``README.md`` for the options and what each Debian 12 provider really does.

Importing this package opens nothing: the spec is always offered (so ``vkshmem info`` lists
it, with or without libfabric). It looks at the native module where it loads, to say whether
GPU memory exported as a dma-buf can be registered (``memory_kinds`` holds ``"dmabuf"`` where
the binding was built against headers with ``FI_MR_DMABUF``, libfabric 1.20+; a provider that
then refuses one raises an error naming ``VKSHMEM_OFI_PROVIDER``, and that memory takes
another route).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vkshmem.plugin import AmoOp, TransportContext, TransportError, TransportSpec, hookimpl

if TYPE_CHECKING:
    from ._transport import OfiTransport

__all__ = ["NAME", "OPTIONS", "PROVIDER_VAR", "SPEC", "load_native", "open_transport",
           "register_transports"]

NAME = "ofi"
#: The environment variable naming the provider where the rail option ``provider=`` does not.
PROVIDER_VAR = "VKSHMEM_OFI_PROVIDER"
#: Rail options this transport understands.
OPTIONS = ("provider", "timeout", "poll_us", "idle_poll_us", "busy_us", "spin_us", "emulate",
           "inject_amo", "fence", "force", "native", "contexts")


def load_native() -> Any:
    """The native module ``vkshmem_ofi._ofi`` (loading libfabric), or a TransportError that
    says what to install."""
    try:
        from . import _ofi
    except ImportError as exc:
        raise TransportError(
            NAME, f"cannot load libfabric ({exc}). Install it (`apt-get install libfabric1`, "
            "or libfabric-dev to build), then reinstall vkshmem-ofi (`pip install -e "
            "plugins/ofi`)") from None
    return _ofi


def open_transport(context: TransportContext) -> OfiTransport:
    """The spec's factory: open the ofi transport for one rail (loads libfabric on first use)."""
    load_native()
    from ._transport import OfiTransport

    return OfiTransport(context)


SPEC = TransportSpec(
    name=NAME,
    factory=open_transport,
    priority=40,
    memory_kinds=frozenset({"host", "dmabuf"}),  # dmabuf: builds with FI_MR_DMABUF (carries)
    reach=frozenset({"intra", "inter"}),
    amo_ops=frozenset(AmoOp),
    amo_widths=frozenset({4, 8}),
    native_fence=True,
    put_signal=False,
    description="libfabric (OFI) RDM one-sided put/get/atomics (tcp;ofi_rxm by default, shm, "
                "sockets, or a site provider such as verbs;ofi_rxm); native progress thread",
    variables=((PROVIDER_VAR, "tcp;ofi_rxm", "libfabric provider of the ofi rails whose rail "
                "option provider= is not given."),),
)


@hookimpl
def register_transports(register: Callable[[Any], None]) -> None:
    """Offer the ``ofi`` transport."""
    register(SPEC)

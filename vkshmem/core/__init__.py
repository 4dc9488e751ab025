"""vkshmem core: config, errors, bootstrap, heap, transports, plugins, runtime."""

from pathlib import Path

__all__ = ["get_include"]


def get_include() -> str:
    """Directory of ``_native.h``, for native plugins that call the core's ``vk_amo`` (whose
    address they receive as ``TransportContext.amo_function``)."""
    return str(Path(__file__).parent)

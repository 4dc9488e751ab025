"""The version of the plugin API (:mod:`vkshmem.plugin`), and the check made at load time.

Semantic versioning: the major number changes when a plugin written for the previous one may
no longer work (a hook, a field or a native entry changed meaning or went away); the minor
number when something was added. A spec declares the version it was built for
(``api_version``, default: the version of the vkshmem it was built against). It is loaded
when the majors are equal and its minor is not newer than this vkshmem's.
"""

from __future__ import annotations

__all__ = ["API_VERSION", "check_api_version", "parse_api_version"]

#: ``"major.minor"`` of the plugin API this vkshmem implements.
API_VERSION = "1.2"


def parse_api_version(value: object) -> tuple[int, int]:
    """``(major, minor)`` from ``"1.1"``, ``(1, 1)`` or a bare major ``1`` (minor 0)."""
    if isinstance(value, bool):
        raise ValueError(f"not a plugin API version: {value!r}")
    if isinstance(value, int):
        return value, 0
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value[0], value[1]
    if isinstance(value, str):
        parts = value.strip().split(".")
        if 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
            return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    raise ValueError(f"not a plugin API version: {value!r} (expected \"major.minor\")")


def check_api_version(declared: object) -> str | None:
    """None when a plugin declaring ``declared`` can be loaded, else why not (naming both)."""
    try:
        major, minor = parse_api_version(declared)
    except ValueError as exc:
        return str(exc)
    ours = parse_api_version(API_VERSION)
    if major != ours[0]:
        return (f"it was built for plugin API {major}.{minor}, this vkshmem implements "
                f"{API_VERSION} (another major version: rebuild the plugin against this vkshmem "
                "or install the vkshmem it was built for)")
    if minor > ours[1]:
        return (f"it was built for plugin API {major}.{minor}, newer than the {API_VERSION} "
                "this vkshmem implements (upgrade vkshmem)")
    return None

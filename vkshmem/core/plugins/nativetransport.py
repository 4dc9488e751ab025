"""A base class for transports whose data path is C (re-exported by :mod:`vkshmem.plugin`).

What every native transport needs besides its own calls, written once:

* the status codes of ``vkshmem/plugin.h`` (``VK_ST_*``), read from the shipped header itself
  (one definition), as :data:`STATUS` (name -> code) and :func:`status_message`;
* **held buffers**: a cffi buffer passed to a non-blocking C call must stay alive until the
  call completes (:meth:`NativeTransport.hold`, :meth:`~NativeTransport.release_held`, and the
  C side's "Python holds buffers" flag); one whose operation timed out may still be written by
  the library, so it is never freed (:meth:`~NativeTransport.bury`);
* **finalizers**: the native object is closed when the transport is collected without
  ``close()`` (:meth:`NativeTransport.own`, ``weakref.finalize``);
* **status -> exception**: :meth:`NativeTransport.status_error` turns a status into the
  exception the Python method raises (range and alignment errors as
  :class:`InvalidArgumentError`, the rest as :class:`TransportError` naming the operation), and
  :meth:`NativeTransport.native_error` is :meth:`Transport.native_error` on top of it. A
  subclass adjusts the wording through small hooks (:meth:`~NativeTransport.where`,
  :meth:`~NativeTransport.unreachable`, :meth:`~NativeTransport.segment_size`,
  :meth:`~NativeTransport.status_text`, :meth:`~NativeTransport.error_detail`).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError, TransportError
from ..transports.contract import Transport
from .build import plugin_header

__all__ = ["STATUS", "STATUS_MESSAGES", "NativeTransport", "status_message"]


def _read_status() -> tuple[dict[str, int], dict[int, str]]:
    codes: dict[str, int] = {}
    messages: dict[int, str] = {}
    pattern = re.compile(r"^#define VK_ST_(\w+) \(?(-?\d+)\)?\s*(?:/\*\s*(.*?)\s*\*/)?\s*$")
    for line in plugin_header().read_text().splitlines():
        if m := pattern.match(line):
            name, value = m[1], int(m[2])
            codes[name] = value
            if m[3] and name not in ("FIRST", "LAST", "OK"):
                messages[value] = m[3]
    return codes, messages


#: ``VK_ST_<name>`` of ``vkshmem/plugin.h``: name (without the prefix) -> code
STATUS: dict[str, int]
#: code -> its message (the header's comment)
STATUS_MESSAGES: dict[int, str]
STATUS, STATUS_MESSAGES = _read_status()

_ST = STATUS
_RANGE = frozenset((_ST["SEG"], _ST["BOUNDS"], _ST["ALIGN"], _ST["AMO"]))


def status_message(rc: int) -> str | None:
    """The message of status ``rc`` when it is one of the ``VK_ST_*`` codes, else None."""
    return STATUS_MESSAGES.get(rc)


class NativeTransport(Transport):
    """A :class:`Transport` whose operations are C calls returning ``VK_ST_*`` statuses.

    A subclass sets :attr:`name` (its transport's name, for messages), calls
    :meth:`native_init` first in ``__init__`` (and on every context endpoint it makes without
    ``__init__``), and may set :attr:`native_timeout` for the timeout messages."""

    #: the transport's name in the messages of its errors
    name: str = "native"
    #: seconds an operation may wait (the rail option ``timeout=``), for the messages
    native_timeout: float | None = None

    _held: list[Any]
    _held_flag: Any
    _graveyard: list[Any]

    def native_init(self, held_flag: Any = None) -> None:
        """Start with no held buffers; ``held_flag`` (an ``int *`` of the C side, or None) is
        set to 1 while buffers are held, so that the native quiet defers to Python's."""
        self._held = []
        self._graveyard = []
        self._held_flag = held_flag

    # -- buffers ---------------------------------------------------------------------------

    def set_held_flag(self, flag: Any) -> None:
        """The C side's "Python holds buffers" flag (``int *``), set while any are held."""
        self._held_flag = flag
        if flag is not None:
            flag[0] = 1 if self._held else 0

    def hold(self, buffer: Any) -> None:
        """Keep ``buffer`` alive until :meth:`release_held` (a non-blocking operation's)."""
        self._held.append(buffer)
        if self._held_flag is not None:
            self._held_flag[0] = 1

    def release_held(self) -> list[Any]:
        """The buffers held so far, no longer held (call before completing them: quiet)."""
        held, self._held = self._held, []
        if self._held_flag is not None:
            self._held_flag[0] = 0
        return held

    def drop_held(self) -> None:
        """Forget the held buffers and the flag: the native object they belonged to is gone
        (closed, so its operations are over)."""
        self._held = []
        self._held_flag = None

    def bury(self, *buffers: Any) -> None:
        """Never free ``buffers``: their operation did not complete, the library may still
        read or write them."""
        self._graveyard.extend(b for b in buffers if b is not None)

    # -- finalizers ------------------------------------------------------------------------

    def own(self, close: Callable[..., Any], *args: Any) -> weakref.finalize:
        """Call ``close(*args)`` once: when the returned finalizer is called (by ``close()``)
        or when this object is collected, whichever comes first. ``args`` must not refer to
        this object."""
        return weakref.finalize(self, close, *args)

    # -- status -> exception ---------------------------------------------------------------

    def status_text(self, rc: int) -> str:
        """The name of status ``rc`` in :attr:`TransportError.status` (override for the
        codes of the library the plugin binds)."""
        return status_message(rc) or f"status {rc}"

    def where(self, doing: str, pe: int, seg: int, offset: int, nbytes: int) -> str:
        """The operation, for messages: e.g. ``put to PE 1 (segment 0, offset 8, 4 bytes)``."""
        return f"{doing} PE {pe} (segment {seg}, offset {offset}, {nbytes} bytes)"

    def unreachable(self, pe: int) -> str:
        """The message of ``VK_ST_PEER`` for PE ``pe``."""
        return f"PE {pe} is not reachable through {self.name} (it published no address)"

    def segment_size(self, pe: int, seg: int) -> int | None:
        """The size of PE ``pe``'s segment ``seg``, or None when it has none registered."""
        return None

    def error_detail(self, rc: int) -> str:
        """More about a failure (e.g. the library's last error message), or ``""``."""
        return ""

    def _timed_out(self, who: str) -> str:
        limit = f"within {self.native_timeout:g} s" if self.native_timeout is not None \
            else "within the timeout"
        return (f"no completion {limit} ({who} may be dead or stuck; the rail option timeout= "
                "sets this limit)")

    def range_error(self, rc: int, pe: int, seg: int, offset: int,
                    nbytes: int) -> InvalidArgumentError:
        """The :class:`InvalidArgumentError` of a range, alignment or AMO status."""
        if rc == _ST["AMO"]:
            return InvalidArgumentError(f"{self.name}: AMO width {nbytes} (4 or 8 bytes only)")
        if rc == _ST["ALIGN"]:
            return InvalidArgumentError(f"{self.name}: AMO at offset {offset} is not aligned "
                                        f"to its width {nbytes}")
        size = self.segment_size(pe, seg)
        if size is None:
            return InvalidArgumentError(f"{self.name}: PE {pe} has no segment {seg} registered")
        return InvalidArgumentError(f"{self.name}: {nbytes} bytes at offset {offset} are "
                                    f"outside segment {seg} of PE {pe} ({size} bytes)")

    def status_error(self, rc: int, doing: str, pe: int = -1, seg: int = -1, offset: int = 0,
                     nbytes: int = 0) -> BaseException:
        """The exception for status ``rc`` of ``doing`` (e.g. ``"put to"``) PE ``pe``;
        ``doing`` ``"quiet"`` or ``"fence"``: of a completion call (no PE)."""
        if rc == _ST["CLOSED"]:
            return TransportError(self.name, "the transport is closed")
        if doing in ("quiet", "fence"):
            return self.completion_error(rc, doing)
        if rc == _ST["PEER"]:
            return TransportError(self.name, self.unreachable(pe))
        if rc in _RANGE:
            return self.range_error(rc, pe, seg, offset, nbytes)
        where = self.where(doing, pe, seg, offset, nbytes)
        if rc == _ST["TIMEDOUT"]:
            return TransportError(self.name, f"{where}: {self._timed_out('the peer')}",
                                  status=self.status_text(rc))
        if rc == _ST["FAILED"]:
            return TransportError(self.name, f"{where}: abandoned, a PE of the job failed",
                                  status=self.status_text(rc))
        detail = self.error_detail(rc)
        return TransportError(self.name, f"{where} failed" + (f": {detail}" if detail else ""),
                              status=self.status_text(rc))

    def completion_error(self, rc: int, doing: str = "quiet") -> TransportError:
        """The exception for status ``rc`` of quiet or fence."""
        if rc == _ST["CLOSED"]:
            return TransportError(self.name, "the transport is closed")
        if rc == _ST["TIMEDOUT"]:
            why = self._timed_out("a peer")
        elif rc == _ST["FAILED"]:
            why = "abandoned, a PE of the job failed"
        else:
            detail = self.error_detail(rc)
            why = "an operation failed" + (f": {detail}" if detail else "")
        return TransportError(self.name, f"{doing}: {why}", status=self.status_text(rc))

    def native_error(self, status: int, doing: str, pe: int, seg: int, offset: int,
                     nbytes: int, buffer: object) -> BaseException:
        """The exception the Python method raises for native ``status`` (the core's compiled
        hot path calls this); the buffer of an operation that did not complete is buried."""
        if status in (_ST["TIMEDOUT"], _ST["FAILED"]) and buffer is not None:
            self.bury(buffer)
        return self.status_error(status, doing, pe, seg, offset, nbytes)

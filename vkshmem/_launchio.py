"""The launcher's processes and their output (see :mod:`vkshmem._launcher`): a PE's process
and pipes, the ``preexec_fn`` that gives each PE its own process group and, on Linux, SIGKILL
when the launcher dies, and the forwarding of each PE's output line by line with a
``[pe i] `` prefix (a mixin of the launcher's job)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from ._launcher import LaunchOptions

__all__ = ["_PE", "_Output", "_Stream", "_pdeathsig_setup", "_signal_name"]

_PR_SET_PDEATHSIG = 1
_MAX_LINE = 1 << 16  # forward a line without newline once it gets this long


class _Stream:
    """One pipe of one PE, forwarded line by line."""

    def __init__(self, pe: _PE, file: BinaryIO, is_err: bool) -> None:
        self.pe = pe
        self.file = file
        self.fd = file.fileno()
        self.is_err = is_err
        self.buf = b""
        self.open = True
        os.set_blocking(self.fd, False)


class _PE:
    def __init__(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.rank = rank
        self.proc = proc
        self.returncode: int | None = None
        self.signalled = False  # the launcher sent it a signal
        self.term_at: float | None = None
        self.kill_at: float | None = None
        self.sent_term = False
        self.sent_kill = False
        self.in_traceback = False
        self.last_exception: str | None = None
        self.streams: list[_Stream] = []

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def note_stderr(self, line: str) -> None:
        """Remember the exception line of the last traceback printed on stderr."""
        if line.startswith("Traceback (most recent call last):"):
            self.in_traceback = True
        elif self.in_traceback and line.strip() and not line[0].isspace():
            if line.startswith(("During handling of", "The above exception")):
                return
            self.last_exception = line.strip()
            self.in_traceback = False


def _signal_name(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    desc = signal.strsignal(signum) or ""
    return f"signal {signum} ({name}: {desc})" if desc else f"signal {signum} ({name})"


def _pdeathsig_setup() -> Callable[[], None]:
    """A preexec_fn: own process group; on Linux, SIGKILL when the launcher dies."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            prctl = libc.prctl
            prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                              ctypes.c_ulong]
            prctl.restype = ctypes.c_int
        except (OSError, AttributeError):
            prctl = None

    def preexec() -> None:  # runs in the child between fork and exec: keep it minimal
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os._exit(1)

    return preexec


class _Output:
    """Forwarding of the PEs' output and the launcher's own messages (mixed into the job,
    which provides ``opts``, ``out``, ``err``, ``out_broken`` and the selector ``sel``)."""

    opts: LaunchOptions
    out: BinaryIO | None
    err: BinaryIO | None
    out_broken: bool
    sel: Any

    def say(self, text: str) -> None:
        """A message of the launcher itself, on stderr."""
        data = f"vkshmem run: {text}\n".encode("utf-8", "replace")
        try:
            if self.err is not None:
                self.err.write(data)
                self.err.flush()
            else:
                sys.stderr.write(data.decode())
                sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _emit(self, stream: _Stream, lines: list[bytes]) -> None:
        pe = stream.pe
        if stream.is_err:
            for line in lines:
                pe.note_stderr(line.decode("utf-8", "replace"))
        prefix = f"[pe {pe.rank}] ".encode() if self.opts.prefix else b""
        data = b"".join(prefix + line + b"\n" for line in lines)
        target = self.err if stream.is_err else self.out
        if not stream.is_err and self.out_broken:
            return
        try:
            if target is not None:
                target.write(data)
                target.flush()
            else:
                text_target = sys.stderr if stream.is_err else sys.stdout
                text_target.write(data.decode("utf-8", "replace"))
                text_target.flush()
        except BrokenPipeError:
            if not stream.is_err:
                self.out_broken = True
        except (OSError, ValueError):
            pass

    def _read(self, stream: _Stream) -> bool:
        """Read what is available; False at end of file (or nothing to read now)."""
        try:
            chunk = os.read(stream.fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._close_stream(stream)
            return False
        stream.buf += chunk
        *lines, stream.buf = stream.buf.split(b"\n")
        if len(stream.buf) > _MAX_LINE:
            lines.append(stream.buf)
            stream.buf = b""
        if lines:
            self._emit(stream, lines)
        return True

    def _close_stream(self, stream: _Stream) -> None:
        if not stream.open:
            return
        stream.open = False
        if stream.buf:
            self._emit(stream, [stream.buf])
            stream.buf = b""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(stream.fd)
        with contextlib.suppress(OSError):
            stream.file.close()

    def _drain(self, streams: list[_Stream], limit: float) -> None:
        """Forward what remains in ``streams`` until end of file or ``limit`` seconds."""
        end = time.monotonic() + limit
        pending = [s for s in streams if s.open]
        while pending:
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            with selectors.DefaultSelector() as sel:
                for s in pending:
                    sel.register(s.fd, selectors.EVENT_READ, s)
                for key, _ in sel.select(min(remaining, 0.1)):
                    while self._read(key.data):
                        pass
            pending = [s for s in pending if s.open]
        for s in pending:
            self._close_stream(s)

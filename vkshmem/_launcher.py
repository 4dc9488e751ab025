"""The job launcher behind ``vkshmem run`` (single host; bootstrap ``local``).

The launcher makes the job's secret (:mod:`vkshmem.core.auth`: 256 random bits, handed to each PE
as an inherited sealed memfd named by ``VKSHMEM_JOB_SECRET_FD``, never through the environment),
starts a store server (:mod:`vkshmem.core.bootstrap.store`) on 127.0.0.1 that admits only
connections proving they know it, spawns N PEs (``python script.py args...`` or
``python -m module args...``) with the variables of :data:`PE_VARS`, forwards their output
line by line with a ``[pe i] `` prefix, and watches them:

* when a PE exits non-zero, dies from a signal, or reports a failure through the store
  (``Bootstrap.report_failure``), every other PE gets a short *notice* period (1 s) to end on
  its own: its blocking calls raise PeerFailedError through vkshmem's failure detection
  (:mod:`vkshmem.core.liveness.channel`), so it can name the failed PE; then SIGTERM, and SIGKILL
  after
  the grace period (the PE that reported gets the grace period to finish printing); the
  launcher prints which PE failed and why. ``global_exit`` (``Bootstrap.abort``) ends the
  others with SIGTERM at once;
* a PE whose process ends (even with status 0) is reported to the store, so that a runtime
  that the other PEs initialise again (OpenSHMEM 1.6) fails at once, naming it, instead of
  waiting for it until the bootstrap timeout;
* ``--timeout`` ends the job the same way, with exit status 124;
* when the job ends, shared-memory files its PEs' plugins named after it and left under
  ``/dev/shm`` (a PE killed by SIGKILL runs no clean-up; :mod:`vkshmem.core.shmnames`) are
  removed;
* SIGINT/SIGTERM/SIGHUP on the launcher end every PE (a second one kills them at once);
* each PE runs in its own process group (so a terminal's Ctrl-C reaches only the launcher,
  and ending a PE ends what it started) and, on Linux, gets SIGKILL if the launcher dies
  (``PR_SET_PDEATHSIG``).

Exit status: 0 when every PE exits 0; otherwise that of the first failure: the PE's exit code,
128 + the signal number for a PE killed by a signal, 1 for a PE that reported a failure but
was ended before it exited on its own, the status given to ``global_exit``, 124 for
``--timeout``, 128 + the signal number when the launcher itself was interrupted.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO

from ._launchio import _PE, _Output, _pdeathsig_setup, _signal_name, _Stream
from .core.auth import FD_VAR, FILE_VAR, SECRET_VAR, new_secret, secret_fd
from .core.bootstrap.store import StoreServer, format_seconds
from .core.shmnames import remove_job_shm

__all__ = ["PE_VARS", "LaunchOptions", "run_job"]

#: What the launcher puts in each PE's environment (besides ``PYTHONUNBUFFERED=1``).
PE_VARS = {
    "VKSHMEM_LAUNCHER": "host:port of the launcher's bootstrap store",
    "VKSHMEM_PE": "this PE's rank, 0 .. N-1",
    "VKSHMEM_NPES": "the number of PEs, N",
    "VKSHMEM_JOB_ID": "an id unique to this job (the store rejects PEs of other jobs)",
    FD_VAR: "an inherited fd (a sealed memfd) holding the job's random secret, which every "
            "connection to the store and between PEs must prove it knows",
}
TIMEOUT_EXIT = 124
_DRAIN_AFTER_EXIT = 1.0  # how long to wait for output of a PE's leftover children
_FAILED_PE_EXIT = 0.5  # how long a PE's report of another's failure waits for that one's exit


@dataclass
class LaunchOptions:
    """What ``vkshmem run`` was asked to do."""

    npes: int
    command: list[str]  # the interpreter's arguments: [script, *args] or ["-m", module, *args]
    prefix: bool = True
    timeout: float | None = None
    grace: float = 3.0
    python: str = field(default_factory=lambda: sys.executable)
    notice: float = 1.0  # after a PE failure, before the others get SIGTERM
    host: str = "127.0.0.1"


@dataclass
class _Cause:
    """Why the job is ending early."""

    kind: str  # exit, signal, report, abort, timeout, interrupt, spawn
    text: str
    rank: int = -1
    code: int = 1


class _Job(_Output):
    def __init__(self, opts: LaunchOptions) -> None:
        self.opts = opts
        self.job_id = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.pes: list[_PE] = []
        self.cause: _Cause | None = None
        self.ending = False
        self.deadline = None if not opts.timeout else time.monotonic() + opts.timeout
        self.events: queue.SimpleQueue[tuple[str, int, str | int]] = queue.SimpleQueue()
        self.signals: list[int] = []
        self.out = self._binary(sys.stdout)
        self.err = self._binary(sys.stderr)
        self.out_broken = False
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        secret = new_secret()
        self.secret_fd = secret_fd(secret)
        try:
            self.server = StoreServer(opts.npes, opts.host, 0, job_id=self.job_id,
                                      on_failure=self._on_failure, on_abort=self._on_abort,
                                      secret=secret)
        except BaseException:
            os.close(self.secret_fd)
            raise

    @staticmethod
    def _binary(stream: object) -> BinaryIO | None:
        return getattr(stream, "buffer", None)

    # -- callbacks from other threads / signal handlers ----------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"!")

    def _on_failure(self, rank: int, text: str) -> None:
        self.events.put(("failure", rank, text))
        self._wake()

    def _on_abort(self, rank: int, status: int) -> None:
        self.events.put(("abort", rank, status))
        self._wake()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)
        self._wake()

    # -- process control ------------------------------------------------------------------
    def _spawn(self) -> bool:
        host, port = self.server.address
        base = {k: v for k, v in os.environ.items() if k not in (SECRET_VAR, FILE_VAR)}
        base.update(VKSHMEM_LAUNCHER=f"{host}:{port}", VKSHMEM_NPES=str(self.opts.npes),
                    VKSHMEM_JOB_ID=self.job_id, PYTHONUNBUFFERED="1")
        base[FD_VAR] = str(self.secret_fd)
        preexec = _pdeathsig_setup()
        argv = [self.opts.python, *self.opts.command]
        for rank in range(self.opts.npes):
            env = dict(base, VKSHMEM_PE=str(rank))
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env, close_fds=True,
                                        pass_fds=(self.secret_fd,), preexec_fn=preexec)
            except OSError as exc:
                self._begin_end(_Cause("spawn", f"cannot start PE {rank} ({argv[0]}): {exc}",
                                       rank, 127))
                return False
            pe = _PE(rank, proc)
            assert proc.stdout is not None and proc.stderr is not None
            for file, is_err in ((proc.stdout, False), (proc.stderr, True)):
                stream = _Stream(pe, file, is_err)
                pe.streams.append(stream)
                self.sel.register(stream.fd, selectors.EVENT_READ, stream)
            self.pes.append(pe)
        return True

    def _signal_pe(self, pe: _PE, sig: int) -> None:
        pe.signalled = True
        try:
            os.killpg(pe.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            if pe.alive:
                with contextlib.suppress(OSError):
                    pe.proc.send_signal(sig)

    def _begin_end(self, cause: _Cause, spare: int = -1) -> None:
        """Record the first cause and start ending the PEs still running."""
        if self.cause is None:
            self.cause = cause
        if self.ending:
            return
        self.ending = True
        now = time.monotonic()
        grace = self.opts.grace
        notice = self.opts.notice if cause.kind in ("exit", "signal", "report") else 0.0
        ended = []
        for pe in self.pes:
            if pe.rank == spare and pe.alive:
                pe.term_at, pe.kill_at = now + grace, now + 2 * grace
                continue
            if pe.alive:
                ended.append(pe.rank)
                if notice > 0:  # time to raise PeerFailedError and end on its own
                    pe.term_at, pe.kill_at = now + notice, now + notice + grace
                    continue
            # Also signal exited PEs' groups: ends what they left behind.
            self._signal_pe(pe, signal.SIGTERM)
            pe.sent_term = True
            pe.term_at, pe.kill_at = now, now + grace
        if cause.kind in ("timeout", "interrupt", "spawn"):
            what = f"ending all {len(ended)} running PEs" if ended else "no PE is running"
        elif ended:
            what = f"ending the other PEs ({', '.join(map(str, ended))})"
            if notice > 0:
                what += f" (SIGTERM in {format_seconds(notice)} unless they end first)"
        else:
            what = "no other PE is running"
        self.say(f"{cause.text}; {what}")

    def _escalate(self, now: float) -> None:
        for pe in self.pes:
            if not pe.alive:
                continue
            if pe.term_at is not None and now >= pe.term_at and not pe.sent_term:
                self._signal_pe(pe, signal.SIGTERM)
                pe.sent_term = True
            if pe.kill_at is not None and now >= pe.kill_at and not pe.sent_kill:
                self._signal_pe(pe, signal.SIGKILL)
                pe.sent_kill = True
                self.say(f"PE {pe.rank} did not end within {format_seconds(self.opts.grace)} "
                         f"of SIGTERM; sent SIGKILL")

    def _kill_all_now(self) -> None:
        for pe in self.pes:
            if pe.alive and not pe.sent_kill:
                self._signal_pe(pe, signal.SIGKILL)
                pe.sent_kill = True

    def _handle_events(self) -> None:
        while True:
            try:
                kind, rank, value = self.events.get_nowait()
            except queue.Empty:
                break
            if kind == "failure" and str(value).startswith("PeerFailedError"):
                # A PE that noticed another's failure: the failed PE's own end (its process
                # may still be exiting) is the cause to name.
                end = time.monotonic() + _FAILED_PE_EXIT
                while not self.ending and time.monotonic() < end:
                    self._reap()
                    time.sleep(0.02)
            if self.ending:
                continue
            if kind == "failure":
                self._begin_end(_Cause("report", f"PE {rank} failed: {value}", rank, 1),
                                spare=rank)
            elif kind == "abort":
                status = int(value)
                self._begin_end(_Cause("abort", f"PE {rank} called global_exit({status})",
                                       rank, status & 0xFF), spare=rank)
        while self.signals:
            signum = self.signals.pop(0)
            if self.ending:
                self.say(f"{signal.Signals(signum).name} again: killing every PE now")
                self._kill_all_now()
            else:
                name = signal.Signals(signum).name
                self._begin_end(_Cause("interrupt", f"interrupted by {name}", -1, 128 + signum))

    def _reap(self) -> None:
        for pe in self.pes:
            if not pe.alive:
                continue
            rc = pe.proc.poll()
            if rc is None:
                continue
            # Forward (and read the traceback from) what it printed before looking at why.
            self._drain(pe.streams, 0.2)
            pe.returncode = rc
            if rc != 0 and not self.ending:
                self._exit_cause(pe, rc)
            # After the cause is recorded: the PE cannot initialise again, so a round of a
            # re-initialised runtime that waits for it fails at once, naming it.
            self.server.member_exited(pe.rank)

    def _exit_cause(self, pe: _PE, rc: int) -> None:
        """Start ending the job because ``pe`` exited with ``rc`` (non-zero)."""
        if rc < 0:
            text = f"PE {pe.rank} was killed by {_signal_name(-rc)}"
            code = 128 - rc
            kind = "signal"
        else:
            text = f"PE {pe.rank} exited with code {rc}"
            if pe.last_exception:
                text += f" ({pe.last_exception})"
            code = rc
            kind = "exit"
        self._begin_end(_Cause(kind, text, pe.rank, code))

    # -- the job ----------------------------------------------------------------------------
    def run(self) -> int:
        handlers: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            if self._spawn():
                self.server.start()  # threads only after every fork: preexec_fn stays safe
            self._loop()
        finally:
            self._kill_all_now()
            for pe in self.pes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pe.returncode = pe.proc.wait(5.0)
            for pe in self.pes:
                for stream in pe.streams:
                    self._close_stream(stream)
            remove_job_shm(self.job_id)  # what killed PEs' plugins left in /dev/shm
            self.server.close()
            with contextlib.suppress(OSError):
                os.close(self.secret_fd)
            self.sel.close()
            for fd in (self.wake_r, self.wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            for sig, old in handlers.items():
                if old is not None:
                    signal.signal(sig, old)  # type: ignore[arg-type]
        return self._exit_code()

    def _loop(self) -> None:
        while True:
            self._handle_events()
            self._reap()
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline and not self.ending:
                limit = format_seconds(self.opts.timeout or 0)
                self._begin_end(_Cause("timeout", f"the job ran past --timeout {limit}", -1,
                                       TIMEOUT_EXIT))
            self._escalate(now)
            if all(not pe.alive for pe in self.pes):
                break
            wait = 0.1
            if self.deadline is not None and not self.ending:
                wait = max(0.0, min(wait, self.deadline - now))
            for key, _ in self.sel.select(wait):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 4096)
                else:
                    self._read(key.data)
        # Every PE has exited. End what they left behind in their process groups (it would be
        # orphaned, and may hold the output pipes open), after forwarding what it printed.
        for pe in self.pes:
            with contextlib.suppress(OSError):
                os.killpg(pe.proc.pid, signal.SIGTERM)
        self._drain([s for pe in self.pes for s in pe.streams], _DRAIN_AFTER_EXIT)
        for pe in self.pes:
            with contextlib.suppress(OSError):
                os.killpg(pe.proc.pid, signal.SIGKILL)

    def _exit_code(self) -> int:
        cause = self.cause
        if cause is None:
            bad = [pe for pe in self.pes if pe.returncode not in (0, None)]
            if not bad:
                return 0
            rc = bad[0].returncode or 1
            return 128 - rc if rc < 0 else rc
        code = cause.code
        if cause.kind == "report":
            pe = self.pes[cause.rank]
            rc = pe.returncode
            if rc is not None and rc > 0:
                code = rc
            elif rc is not None and rc < 0 and not pe.signalled:
                code = 128 - rc
        self.say(f"job failed with exit code {code}: {cause.text}")
        return code


def run_job(opts: LaunchOptions) -> int:
    """Run one job to its end; returns the exit status for the launcher (see module doc)."""
    if opts.npes < 1:
        raise ValueError(f"npes must be >= 1, got {opts.npes}")
    return _Job(opts).run()

"""Multi-PE helper for launcher tests: PE 1 (or every PE) misbehaves as ``sys.argv[1]`` says.

Modes: ok, env, argv, leave-child, exit, raise, signal, report, report-hang, abort, sleep, stubborn,
and re-initialisation (OpenSHMEM 1.6) at the bootstrap: rejoin (every PE closes and opens again),
rejoin-exit (PE 1 closes and exits 0 instead), rejoin-die (PE 1 is killed between its close and
its next open), drop-rejoin (PE 1 loses its connection without a goodbye, then tries to open
again, and sleeps when refused). Sleeping PEs print ``ready <pid>`` first, so a test can wait
for them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

RANK = int(os.environ.get("VKSHMEM_PE", "0"))
SIZE = int(os.environ.get("VKSHMEM_NPES", "1"))


def open_boot():  # type: ignore[no-untyped-def]
    from vkshmem.core.bootstrap.select import open_bootstrap
    from vkshmem.core.config import load as load_config
    from vkshmem.core.plugins.loader import load_plugins

    cfg = load_config()
    return open_bootstrap(cfg, load_plugins(cfg).bootstraps, os.environ)


def sleep_forever() -> None:
    print(f"ready {os.getpid()}", flush=True)
    while True:
        time.sleep(1000)


def rejoin(mode: str) -> None:
    """The re-initialisation modes: open, exchange, close, open again and exchange again."""
    boot = open_boot()
    assert boot.allgather(b"%d" % RANK) == [b"%d" % r for r in range(SIZE)]
    if mode == "drop-rejoin" and RANK == 1:
        boot.client._sock.close()  # the connection dies, not the process: no goodbye
        boot.client._sock = None
        end = time.monotonic() + 10
        while True:
            try:
                open_boot()
            except Exception as exc:  # refused; the launcher must end the job anyway
                if "already connected" in str(exc) and time.monotonic() < end:
                    time.sleep(0.05)  # the store has not seen the drop yet
                    continue
                print(f"refused: {exc}", file=sys.stderr, flush=True)
            sleep_forever()
    boot.close()
    if RANK == 1 and mode == "rejoin-exit":
        sys.exit(0)
    if RANK == 1 and mode == "rejoin-die":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode != "rejoin":
        print(f"ready {os.getpid()}", flush=True)
    boot = open_boot()
    got = boot.allgather(b"again %d" % RANK)
    assert got == [b"again %d" % r for r in range(SIZE)], got
    print(f"rejoined {RANK} generation {boot.client.generation}", flush=True)
    boot.close()
    sys.exit(0)


def main() -> None:
    mode = sys.argv[1]
    if mode == "ok":
        print(f"hello from {RANK} of {SIZE}")
        print(f"err line from {RANK}", file=sys.stderr)
        sys.stdout.write(f"no newline from {RANK}")
        sys.exit(0)
    if mode == "env":
        keys = ("VKSHMEM_LAUNCHER", "VKSHMEM_PE", "VKSHMEM_NPES", "VKSHMEM_JOB_ID",
                "PYTHONUNBUFFERED")
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        sys.exit(0)
    if mode == "argv":
        print(json.dumps(sys.argv[2:]))
        sys.exit(0)
    if mode == "leave-child":  # exits 0, leaving a child process behind
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
        print(f"ready {child.pid}", flush=True)
        sys.exit(0)
    if mode == "exit":
        code = int(sys.argv[2])
        if RANK == SIZE - 1:
            time.sleep(0.2)
            sys.exit(code)
        sys.exit(0)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sleep_forever()
    if mode.startswith(("rejoin", "drop-rejoin")):
        rejoin(mode)
    if mode in ("report", "report-hang", "abort"):
        boot = open_boot()
        boot.barrier()
        if boot.rank != 1:
            sleep_forever()
        if mode == "report":
            print("PE 1 is about to fail", file=sys.stderr, flush=True)
            boot.report_failure("RuntimeError: custom reason 42")
            sys.exit(7)
        if mode == "report-hang":
            boot.report_failure("RuntimeError: reported, then hung")
            sleep_forever()
        boot.abort(5)
    if mode == "sleep" or RANK != 1:
        sleep_forever()
    # PE 1 misbehaves:
    if mode == "raise":
        time.sleep(0.2)
        raise ValueError("boom from pe 1")
    if mode == "signal":
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

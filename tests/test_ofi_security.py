"""Issue 36: a stranger on the same host must not reach a PE's memory through the ofi transport.

A 2-PE job (``VKSHMEM_TRANSPORTS=ofi``, provider ``tcp;ofi_rxm``) runs in a network namespace
made here; each PE writes a canary word at offset 8 of its symmetric heap and waits while an
intruder, ``tests/intruders/ofi_rma.c`` (the public libfabric API, compiled here) run as user
``nobody``, inserts every listener of the namespace (``ss -ltn``) as a peer and tries fi_read
and fi_write of 8 bytes at offsets 0..64 with keys 0..16. Before the fix the keys were 1, 2, ...
and addresses segment offsets, so it read and wrote the heap; now keys are random 64-bit values
and none of its operations may complete. The job must still finish with every canary intact.

Needs root (namespaces, ``setpriv``), iproute2, ``ss``, gcc and libfabric's headers; skipped
otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from attack import private_netns

REPO = Path(__file__).resolve().parent.parent
INTRUDER = Path(__file__).parent / "intruders" / "ofi_rma.c"
VKSHMEM = REPO / ".venv" / "bin" / "vkshmem"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, setpriv to user nobody)"
    for tool in ("ip", "setpriv", "gcc", "ss"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not Path("/usr/include/rdma/fabric.h").exists():
        return "needs libfabric's headers (/usr/include/rdma/fabric.h, libfabric-dev)"
    if not VKSHMEM.exists():
        return f"needs {VKSHMEM}"
    try:
        import vkshmem_ofi  # noqa: F401
    except ImportError as exc:
        return f"the ofi plugin is not installed: {exc}"
    return None


PE_SCRIPT = textwrap.dedent("""
    import os, struct, sys, time
    from vkshmem import shmem

    me = shmem.my_pe()
    rt = shmem._state.rt
    check_dir = os.environ["OFI_SEC_DIR"]
    buf = rt.host.segment.buffer  # the symmetric heap (segment 0), offset 0 = its first byte
    canary = struct.pack("<Q", 0x5EC0DE0000C0FFEE ^ me)
    buf[8:16] = canary
    shmem.barrier_all()
    # the transport is up (the barrier went through ofi): let the intruder in
    open(os.path.join(check_dir, f"ready.{me}"), "w").close()
    deadline = time.monotonic() + 45
    while not os.path.exists(os.path.join(check_dir, "done")) and time.monotonic() < deadline:
        time.sleep(0.05)
    shmem.barrier_all()
    got = bytes(buf[8:16])
    print(f"PE {me}: canary {'intact' if got == canary else 'OVERWRITTEN with ' + got.hex()}",
          flush=True)
    shmem.barrier_all()
    sys.exit(0 if got == canary else 3)
""")


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)  # type: ignore[call-overload]


@pytest.fixture
def netns() -> Iterator[str]:
    with private_netns("vkofisec") as name:
        yield name


def test_intruder_cannot_read_or_write_a_pe_heap(netns: str) -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    ns = netns
    with tempfile.TemporaryDirectory(prefix="vkofisec-") as tmp:
        d = Path(tmp)
        d.chmod(0o755)
        exe = d / "ofi_rma"
        cc = _run(["gcc", "-O1", "-Wall", "-o", str(exe), str(INTRUDER), "-lfabric"])
        if cc.returncode != 0:
            pytest.skip(f"cannot compile the intruder against libfabric: {cc.stderr[-2000:]}")
        exe.chmod(0o755)
        script = d / "canary.py"
        script.write_text(PE_SCRIPT)
        flags = d / "flags"
        flags.mkdir()
        env = {**os.environ, "VKSHMEM_TRANSPORTS": "ofi", "VKSHMEM_SHM": "0",
               "VKSHMEM_OFI_PROVIDER": "tcp;ofi_rxm", "OFI_SEC_DIR": str(flags),
               "VKSHMEM_SYMMETRIC_SIZE": "16M"}
        env.pop("FI_PROVIDER", None)
        job = subprocess.Popen(["ip", "netns", "exec", ns, str(VKSHMEM), "run", "-n", "2",
                                "--timeout", "60", str(script)], env=env, cwd=str(d),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            t0 = time.monotonic()
            while not all((flags / f"ready.{pe}").exists() for pe in (0, 1)):
                if job.poll() is not None or time.monotonic() - t0 > 60:
                    out = job.communicate(timeout=10)[0] if job.poll() is not None else ""
                    pytest.fail(f"the job did not get ready: {out}")
                time.sleep(0.05)
            ss = _run(["ip", "netns", "exec", ns, "ss", "-Hltn"])
            listeners = sorted({m.group(1) for m in
                                re.finditer(r"\s(\S+:\d+)\s+\S+:\*", ss.stdout)})
            listeners = [a.replace("*:", "0.0.0.0:").replace("[::]:", "127.0.0.1:")
                         .replace("0.0.0.0:", "127.0.0.1:") for a in listeners]
            assert listeners, ss.stdout
            intruder = _run(["ip", "netns", "exec", ns, "setpriv", "--reuid=65534",
                             "--regid=65534", "--clear-groups", str(exe), "30", *listeners])
        finally:
            (flags / "done").touch()
        try:
            out = job.communicate(timeout=90)[0]
        except subprocess.TimeoutExpired:
            job.kill()
            out = job.communicate()[0]
            pytest.fail(f"the job did not finish after the intrusion: {out}")
    report = intruder.stdout + intruder.stderr
    summary = re.search(r"intruder: reads_ok=(\d+) writes_ok=(\d+) tried=(\d+)", report)
    assert intruder.returncode == 0 and summary, report
    print(f"listeners {listeners}\n{report}\n{out}")
    assert int(summary.group(3)) > 0, report
    assert (int(summary.group(1)), int(summary.group(2))) == (0, 0), \
        f"the intruder reached PE memory without the job's keys:\n{report}\njob:\n{out}"
    assert job.returncode == 0, f"job failed (canary?):\n{out}\nintruder:\n{report}"
    assert out.count("canary intact") == 2, out

"""A stranger on the host against a real 2-PE job over the ucx transport (issue 36).

The attacker, ``tests/intruders/uct_put.c``, is a small program on UCX's public UCT API (no
UCP, no vkshmem, no secret of the job) run as user nobody: it connects to a port with UCX's tcp
transport and puts 8 bytes at an address it names, with remote key 0. UCX's tcp checks no key:
wherever it reaches a PE's UCX tcp listener it writes into the PE's memory. Everything runs in
a network namespace of the test's own, so "every listening TCP port" is the job's ports.

* default settings: the ucx transport opens no UCX tcp, so no port lets the attacker write and
  the PEs' canaries are intact;
* ``UCX_TLS=tcp,self`` without the opt-in: the job refuses to start (ConfigError naming
  VKSHMEM_UCX_TRUSTED_NETWORK);
* the documented trusted-network case (``VKSHMEM_UCX_TRUSTED_NETWORK=1 UCX_TLS=tcp,self``): the
  attack succeeds (the canaries are overwritten), which shows the attacker works and that the
  default case passing means something.

Needs root, iproute2, setpriv, gcc and the UCX wheel's headers; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from attack import listeners, private_netns, socket_inodes

pytest.importorskip("vkshmem_ucx")

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parent.parent
INTRUDER = Path(__file__).parent / "intruders" / "uct_put.c"
VKSHMEM = REPO / ".venv" / "bin" / "vkshmem"
CANARY = 0x5AFE_C0DE_5AFE_C0DE
EVIL = 0x0BAD_0BAD_0BAD_0BAD
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
UCX_LIBS = ("libuct.so.0", "libucs.so.0", "libucm.so.0")

# Each PE: a symmetric canary, its address and pid in a file, a bounded wait while the attacker
# runs, then a put and a get between the PEs (the job still works) and the canary's check.
PE_SCRIPT = textwrap.dedent(f"""\
    import json, os, sys, time
    import numpy as np
    from vkshmem import shmem

    me, n = shmem.my_pe(), shmem.n_pes()
    out = os.environ["UCXSEC_DIR"]
    canary = shmem.zeros(8, np.int64)
    canary[:] = {CANARY:#x}
    work = shmem.zeros(4, np.int64)
    shmem.barrier_all()
    info = {{"pe": me, "pid": os.getpid(), "addr": canary.ctypes.data}}
    with open(f"{{out}}/pe{{me}}.tmp", "w") as f:
        json.dump(info, f)
    os.rename(f"{{out}}/pe{{me}}.tmp", f"{{out}}/pe{{me}}.json")
    print(f"pe {{me}} pid {{os.getpid()}} canary at {{canary.ctypes.data:#x}}", flush=True)
    # wait for the attacker, busy as a PE of a job: gets from the peer keep UCX progressing
    right, left = (me + 1) % n, (me - 1) % n
    probe = np.zeros(1, np.int64)
    deadline = time.monotonic() + 100
    while not os.path.exists(f"{{out}}/go"):
        if time.monotonic() > deadline:
            sys.exit(f"pe {{me}}: no go after 100 s")
        shmem.get(probe, work[1:2], right)
        time.sleep(0.001)
    seen = [int(v) & 0xFFFFFFFFFFFFFFFF for v in canary]
    print(f"pe {{me}} canary after the attack: {{seen[0]:#x}}", flush=True)
    shmem.barrier_all()
    shmem.put(work[:1], np.array([1000 + me], np.int64), right)
    shmem.barrier_all()
    assert int(work[0]) == 1000 + left, f"pe {{me}}: put saw {{int(work[0])}}"
    got = np.zeros(1, np.int64)
    shmem.get(got, work[:1], right)
    assert int(got[0]) == 1000 + me, f"pe {{me}}: get saw {{int(got[0])}}"
    shmem.barrier_all()
    print(f"routes: {{sorted({{r.name for r in shmem._state.rt.routing.routes}})}}", flush=True)
    if os.environ.get("UCXSEC_REPORT") != "1":
        assert seen == [{CANARY:#x}] * 8, f"pe {{me}}: canary overwritten: {{seen[0]:#x}}"
    print(f"pe {{me}} ucxsec ok", flush=True)
""")


def _ucx_dirs() -> tuple[Path, Path] | None:
    """The UCX wheel's include and lib directories (of the venv the job runs from)."""
    try:
        import libucx  # type: ignore[import-not-found]
    except ImportError:
        return None
    root = Path(libucx.__file__).resolve().parent
    inc, lib = root / "include", root / "lib"
    if not (inc / "uct" / "api" / "uct.h").is_file() or not (lib / "libuct.so").exists():
        return None
    return inc, lib


def _missing(tools: tuple[str, ...]) -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, setpriv)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not VKSHMEM.exists():
        return f"needs {VKSHMEM}"
    return None


#: why no job can run in a namespace here, or None
MISSING_NS = _missing(("ip",))
#: why the attacker cannot be built and run as nobody here, or None
MISSING = MISSING_NS or _missing(("setpriv", "gcc")) or (
    "needs the libucx wheel's UCT headers and libraries" if _ucx_dirs() is None else None)


def _others_can_read(path: Path) -> bool:
    """Can a user of no group of ours (nobody) read ``path``: o+r on it, o+x on its folders?"""
    path = path.resolve()
    if not path.stat().st_mode & stat.S_IROTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)


@pytest.fixture(scope="module")
def intruder() -> Iterator[Path]:
    """``uct_put`` compiled into a folder nobody can read; the UCX libraries beside it when
    nobody cannot read the wheel's."""
    if MISSING:
        pytest.skip(MISSING)
    inc, lib = _ucx_dirs()  # type: ignore[misc]
    work = Path(tempfile.mkdtemp(prefix="vkshmem-ucxsec-"))
    try:
        work.chmod(0o755)
        rpath = str(lib)
        if not all(_others_can_read(lib / name) for name in UCX_LIBS):
            for name in UCX_LIBS:
                shutil.copy2((lib / name).resolve(), work / name)
                (work / name).chmod(0o755)
            rpath = "$ORIGIN"
        exe = work / "uct_put"
        build = subprocess.run(["gcc", "-O1", "-Wall", "-Wextra", "-o", str(exe),
                                str(INTRUDER), f"-I{inc}", f"-L{lib}", "-luct", "-lucs",
                                f"-Wl,-rpath,{rpath}"],
                               capture_output=True, text=True, timeout=120)
        assert build.returncode == 0, build.stderr
        exe.chmod(0o755)
        yield exe
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace of this test's own with only lo, up."""
    if MISSING_NS:
        pytest.skip(MISSING_NS)
    with private_netns("vkshmem-ucxsec") as name:
        yield name


@dataclass
class Attempt:
    port: int
    owner: str  # "PE i (pid p)" or "not a PE"
    pe: int  # whose canary address it named
    rc: int
    output: str


@dataclass
class Outcome:
    rc: int
    output: str
    attempts: list[Attempt]


def _attack(ns: str, exe: Path, pes: list[dict[str, int]]) -> list[Attempt]:
    """``uct_put`` as nobody against every listening port of the namespace: a PE's own port
    with that PE's canary address, any other port with every PE's."""
    owned = {pe["pe"]: socket_inodes(pe["pid"]) for pe in pes}
    attempts = []
    for port, inodes in sorted(listeners(ns).items()):
        owners = [pe for pe in pes if inodes & owned[pe["pe"]]]
        for pe in owners or pes:
            owner = (f"PE {pe['pe']} (pid {pe['pid']})" if owners else "not a PE")
            r = subprocess.run(["ip", "netns", "exec", ns, *NOBODY, str(exe), str(port),
                                f"{pe['addr']:x}", f"{EVIL:x}"],
                               env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                               capture_output=True, text=True, timeout=30)
            attempts.append(Attempt(port, owner, pe["pe"], r.returncode, r.stdout + r.stderr))
    return attempts


def run_job(ns: str, exe: Path | None, env: dict[str, str]) -> Outcome:
    """The 2-PE job in ``ns``; once both PEs have put out their canaries, the attacker (if
    ``exe``) tries every port; then the PEs go on and end."""
    with tempfile.TemporaryDirectory(prefix="vkshmem-ucxsec-job-") as tmp:
        out = Path(tmp)
        script = out / "ucxsec_pe.py"
        script.write_text(PE_SCRIPT)
        if exe is None:
            (out / "go").touch()
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("UCX_", "VKSHMEM_"))}
        full_env.update({"VKSHMEM_TRANSPORTS": "ucx", "VKSHMEM_SHM": "0",
                         "VKSHMEM_SYMMETRIC_SIZE": "64M", "VKSHMEM_WAIT_TIMEOUT": "60",
                         "UCXSEC_DIR": str(out), **env})
        job = subprocess.Popen(["ip", "netns", "exec", ns, str(VKSHMEM), "run", "-n", "2",
                                "--timeout", "60", str(script)],
                               env=full_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        attempts: list[Attempt] = []
        try:
            if exe is not None:
                deadline = time.monotonic() + 60
                files = [out / f"pe{i}.json" for i in range(2)]
                while not all(f.exists() for f in files) and job.poll() is None:
                    assert time.monotonic() < deadline, "the PEs did not start in 60 s"
                    time.sleep(0.05)
                if job.poll() is None:
                    pes = [json.loads(f.read_text()) for f in files]
                    attempts = _attack(ns, exe, pes)
                (out / "go").touch()
            output = job.communicate(timeout=90)[0]
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        return Outcome(job.returncode, output, attempts)


def _report(outcome: Outcome) -> str:
    lines = [f"job exit {outcome.rc}", outcome.output]
    for a in outcome.attempts:
        lines.append(f"--- port {a.port} ({a.owner}), PE {a.pe}'s canary: exit {a.rc}")
        lines.append(a.output.rstrip())
    return "\n".join(lines)


def _print(outcome: Outcome) -> None:
    print(_report(outcome))  # shown with -s, and on failure


def test_default_settings_give_the_stranger_no_port(intruder: Path, netns: str) -> None:
    outcome = run_job(netns, intruder, {})
    _print(outcome)
    report = _report(outcome)
    assert outcome.attempts, "no listening port found: the attacker tried nothing\n" + report
    # every attempt ran (no setup error, exit 2) and failed (exit 1): nothing was written
    assert all(a.rc == 1 for a in outcome.attempts), report
    assert not any("WROTE" in a.output for a in outcome.attempts), report
    assert outcome.rc == 0, report
    assert outcome.output.count("ucxsec ok") == 2, report
    assert outcome.output.count(f"canary after the attack: {CANARY:#x}") == 2, report
    assert outcome.output.count("routes: ['ucx']") == 2, report


def test_naming_tcp_without_the_opt_in_is_refused(netns: str) -> None:
    outcome = run_job(netns, None, {"UCX_TLS": "tcp,self"})
    report = _report(outcome)
    assert outcome.rc != 0, report
    assert "VKSHMEM_UCX_TRUSTED_NETWORK" in outcome.output, report
    assert "ConfigError" in outcome.output or "names tcp" in outcome.output, report
    assert "ucxsec ok" not in outcome.output, report


def test_on_a_trusted_network_the_attack_works(intruder: Path, netns: str) -> None:
    """The documented trusted case (and the listener before the fix): UCX's tcp writes what a
    stranger sends. Proves the attacker works, so the default case passing means something."""
    outcome = run_job(netns, intruder, {"UCX_TLS": "tcp,self",
                                        "VKSHMEM_UCX_TRUSTED_NETWORK": "1",
                                        "UCXSEC_REPORT": "1"})
    _print(outcome)
    report = _report(outcome)
    wrote = [a for a in outcome.attempts if a.rc == 0]
    assert wrote and all("WROTE" in a.output for a in wrote), report
    assert {a.pe for a in wrote} == {0, 1}, report  # into each PE through its own port
    assert all(a.owner.startswith(f"PE {a.pe} ") for a in wrote), report
    assert outcome.output.count(f"canary after the attack: {EVIL:#x}") == 2, report

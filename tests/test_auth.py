"""The per-job secret: where each launcher gets it, what the ``env`` bootstrap refuses, fd passing
that only the job's processes can use, and native shm calls that check their own arguments."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from vkshmem.core import auth, fdshare
from vkshmem.core.bootstrap import builtin, storeboot
from vkshmem.core.errors import BootstrapError, ConfigError

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).parent.parent


# -- loading the secret ------------------------------------------------------------------------


def test_secret_from_a_variable_a_private_file_or_an_inherited_fd(tmp_path: Path) -> None:
    assert auth.load_secret({}) is None
    assert auth.load_secret({auth.SECRET_VAR: "a" * 20}) == (b"a" * 20, auth.SECRET_VAR)
    path = tmp_path / "secret"
    path.write_bytes(b"b" * 32 + b"\n")
    path.chmod(0o600)
    assert auth.load_secret({auth.FILE_VAR: str(path)}) == (b"b" * 32, auth.FILE_VAR)
    secret = auth.new_secret()
    fd = auth.secret_fd(secret)
    try:
        # the fd wins over the others, and reads the same every time (re-initialisation)
        env = {auth.FD_VAR: str(fd), auth.SECRET_VAR: "c" * 20}
        assert auth.load_secret(env) == (secret, auth.FD_VAR)
        assert auth.load_secret(env) == (secret, auth.FD_VAR)
        with pytest.raises(OSError):  # sealed: nobody rewrites it
            os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_file_others_can_read_is_refused_naming_the_variable(tmp_path: Path,
                                                                       mode: int) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"s" * 32)
    path.chmod(mode)
    with pytest.raises(ConfigError, match=f"{auth.FILE_VAR}.*chmod 600"):
        auth.load_secret({auth.FILE_VAR: str(path)})


def test_short_or_unreadable_secrets_are_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=auth.SECRET_VAR):
        auth.load_secret({auth.SECRET_VAR: "short"})
    with pytest.raises(ConfigError, match=auth.FD_VAR):
        auth.load_secret({auth.FD_VAR: "987654"})
    with pytest.raises(ConfigError, match=auth.FILE_VAR):
        auth.load_secret({auth.FILE_VAR: "/no/such/file"})


# -- env: no secret beyond loopback, no wildcard -------------------------------------------------


def env_vars(addr: str, port: int, **extra: str) -> dict[str, str]:
    return {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": addr, "MASTER_PORT": str(port),
            **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def outward_address() -> str | None:
    addr = builtin.guess_host_address()
    return None if addr.startswith("127.") else addr


def test_env_without_a_secret_beyond_loopback_refuses_naming_the_variable() -> None:
    addr = outward_address()
    if addr is None:
        pytest.skip("this host has no address beyond loopback")
    with pytest.raises(BootstrapError, match=f"beyond loopback.*{auth.SECRET_VAR}"):
        builtin.EnvBootstrap.open(env_vars(addr, free_port()), 5)
    with pytest.raises(BootstrapError, match=auth.SECRET_VAR):  # an explicit wildcard too
        builtin.EnvBootstrap.open(env_vars("127.0.0.1", free_port(),
                                           VKSHMEM_BOOTSTRAP_BIND="0.0.0.0"), 5)


def test_env_store_binds_the_chosen_address_not_the_wildcard() -> None:
    port = free_port()
    boot = builtin.EnvBootstrap.open(env_vars("127.0.0.1", port,
                                              VKSHMEM_JOB_SECRET="t" * 32), 5)
    try:
        assert boot.server is not None
        assert boot.server.address == ("127.0.0.1", port)
        assert boot.secret == b"t" * 32
        assert boot.allgather(b"x") == [b"x"]
    finally:
        boot.close()
        storeboot._close_env_stores()


def test_env_on_loopback_without_a_secret_still_runs() -> None:
    boot = builtin.EnvBootstrap.open(env_vars("127.0.0.1", free_port()), 5)
    try:
        assert boot.secret == b"" and boot.allgather(b"y") == [b"y"]
    finally:
        boot.close()
        storeboot._close_env_stores()


def test_vkshmem_run_passes_the_secret_as_an_fd_not_in_the_environment(tmp_path: Path) -> None:
    script = tmp_path / "peek.py"
    script.write_text(textwrap.dedent("""
        import os
        from vkshmem.core.auth import load_secret
        secret, var = load_secret(os.environ)
        print("VAR", var, "LEN", len(secret), "INENV", secret.decode() in str(os.environ))
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VKSHMEM_")}
    env["VKSHMEM_JOB_SECRET"] = "x" * 40  # the launcher drops the user's and makes its own
    r = subprocess.run([sys.executable, "-m", "vkshmem", "run", "-n", "2", str(script)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("VAR VKSHMEM_JOB_SECRET_FD LEN 64 INENV False") == 2, r.stdout


# -- fd passing --------------------------------------------------------------------------------

STRANGER = """
import socket, sys, time
name = sys.argv[1].encode().replace(b"@", b"\\0", 1)
socks = []
for _ in range(50):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(name)
    except OSError:
        break
    socks.append(s)
print("connected", len(socks), flush=True)
got = 0
for s in socks:
    try:
        _, fds, _, _ = socket.recv_fds(s, 16, 4)
        got += len(fds)
    except OSError:
        pass
print("fds", got, flush=True)
"""


def test_fd_passing_serves_only_the_peer_processes() -> None:
    """Two PEs (threads of this process, so their peer pid is this one) exchange memfds while
    a stranger process floods PE 0's socket: the stranger gets no fd, the PEs get theirs."""
    fds = [os.memfd_create(f"pe{pe}") for pe in range(2)]
    for pe, fd in enumerate(fds):
        os.write(fd, b"PE %d" % pe)
    ready = threading.Barrier(2)
    names: list[bytes] = [b"", b""]
    stranger: list[subprocess.Popen[str]] = []
    out: dict[int, dict[int, list[int]]] = {}

    def allgather(me: int, name: bytes) -> list[bytes]:
        names[me] = name
        if me == 0 and not stranger:  # PE 0 is listening: let the stranger in before going on
            stranger.append(subprocess.Popen(
                [sys.executable, "-c", STRANGER, "@" + name[1:].decode()],
                stdout=subprocess.PIPE, text=True))
            assert stranger[0].stdout is not None
            assert stranger[0].stdout.readline().startswith("connected")
        ready.wait(10)
        got = list(names)
        ready.wait(10)
        return got

    def pe(me: int) -> None:
        out[me] = fdshare.exchange_fds(me, {1 - me: os.getpid()}, [fds[me]],
                                       lambda name: allgather(me, name),
                                       lambda: ready.wait(10), 10)

    threads = [threading.Thread(target=pe, args=(me,)) for me in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert sorted(out) == [0, 1]
        for me in range(2):
            (got,) = out[me][1 - me]
            assert os.pread(got, 4, 0) == b"PE %d" % (1 - me)
            os.close(got)
        assert stranger[0].stdout is not None
        text = stranger[0].stdout.readline()  # (communicate would skip what readline buffered)
        assert text.startswith("fds 0"), text
        assert stranger[0].wait(30) == 0
    finally:
        for fd in fds:
            os.close(fd)
        for p in stranger:
            p.kill()
            p.wait(10)


def test_fd_passing_refuses_a_socket_held_by_another_process() -> None:
    name = fdshare._new_name()
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(name)
    squatter.listen(1)
    try:
        with pytest.raises(BootstrapError, match="held by another process"):
            fdshare._fetch(name, 1, os.getpid() + 1, 1, 5)
    finally:
        squatter.close()


# -- native calls check their own arguments ---------------------------------------------------

NATIVE = """
import ctypes
from vkshmem.core._native import ffi, lib
mine = bytearray(b"\\xa5" * 4096)
peer = bytearray(b"\\x5a" * 4096)
addr = lambda b: int(ffi.cast("uintptr_t", ffi.from_buffer(b)))
assert lib.vk_table_init(2, 2) == 0
assert lib.vk_set_local(0, addr(mine), 4096) == 0
assert lib.vk_set_local(7, addr(mine), 4096) == -5
assert lib.vk_set_peer(0, 1, addr(peer)) == 0
assert lib.vk_set_peer(0, 2, addr(peer)) == -5 and lib.vk_set_peer(-1, 0, 1) == -5
src = ffi.from_buffer(bytearray(b"X" * 64))
rc = [lib.vk_shm_put(0, 1, 4090, src, 8), lib.vk_shm_put(0, 1, 2**64 - 4, src, 8),
      lib.vk_shm_put(0, 1, 0, src, 2**63), lib.vk_shm_put(0, 2, 0, src, 8),
      lib.vk_shm_put(0, -1, 0, src, 8), lib.vk_shm_put(5, 1, 0, src, 8),
      lib.vk_shm_put(1, 1, 0, src, 8), lib.vk_shm_get(0, 1, 4096, src, 1),
      lib.vk_direct_put(ffi.from_buffer(mine), src, 8, 9)]
assert rc == [-2, -2, -2, -5, -5, -5, -3, -2, -5], rc
for args, err in [((0, 1, 4095, 4, 8, 1, 0), -2), ((0, 1, 4, 4, 8, 1, 0), -4),
                  ((0, 1, 8, 4, 3, 1, 0), -6), ((0, 1, 8, 99, 8, 1, 0), -6),
                  ((0, 3, 8, 4, 8, 1, 0), -5)]:
    assert lib.vk_shm_amo(*args) == lib.VK_SENTINEL and lib.vk_last_error() == err, args
assert lib.vk_peer_base(0, 5) == 0 and lib.vk_peer_base(9, 0) == 0
assert mine == b"\\xa5" * 4096 and peer == b"\\x5a" * 4096
assert lib.vk_shm_put(0, 1, 4088, src, 8) == 0 and peer[4088:] == b"X" * 8
print("native ok")
"""


def test_native_shm_calls_check_their_own_arguments() -> None:
    r = subprocess.run([sys.executable, "-c", NATIVE], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "native ok" in r.stdout, r.stderr

"""The per-job secret and the challenge-response that proves a connection knows it.

Every listener of a job (the bootstrap store, each hostproxy server) admits a connection only
after it proved that it knows the job's secret, and proves the same back: each side sends a
random nonce and answers the other's with an HMAC-SHA256 over both nonces, a label naming the
direction and what the connection claims to be (``mac``). The secret itself never crosses the
wire; a recorded answer is useless against a new nonce (no replay), and the two directions use
different labels (no reflection). MACs are compared in constant time.

Where the secret comes from (:func:`load_secret`, first found wins):

``VKSHMEM_JOB_SECRET_FD``
    an inherited file descriptor holding it (``vkshmem run`` passes a sealed memfd, so it is in
    no environment and no file);
``VKSHMEM_JOB_SECRET_FILE``
    a file owned by the user and readable by nobody else (mode 0600 or stricter);
``VKSHMEM_JOB_SECRET``
    the secret itself (at least 16 characters; ``/proc/PID/environ`` is readable by the same
    user only).

``vkshmem run`` makes a fresh secret per job; the ``mpi`` bootstrap has rank 0 make one and
broadcasts it; ``env`` reads it as above and refuses to start without one when its store binds
an address beyond loopback. Threat model: other users of the same host and peers on the
network can connect to every listener; they cannot read the job user's memory, files or
environment. Processes of the same user are trusted (they can read the secret anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping

from .errors import ConfigError

__all__ = [
    "FD_VAR", "FILE_VAR", "MAC_SIZE", "MIN_SECRET", "NONCE_SIZE", "SECRET_VAR", "derive_key",
    "load_secret", "mac", "new_nonce", "new_secret", "secret_fd", "verify",
]

SECRET_VAR = "VKSHMEM_JOB_SECRET"
FILE_VAR = "VKSHMEM_JOB_SECRET_FILE"
FD_VAR = "VKSHMEM_JOB_SECRET_FD"
#: Shortest secret accepted (bytes).
MIN_SECRET = 16
#: Longest secret read from an fd or a file (bytes).
MAX_SECRET = 4096
NONCE_SIZE = 16
MAC_SIZE = 32


def new_secret() -> bytes:
    """A fresh random job secret: 256 random bits as 64 hexadecimal digits (text, so that it
    reads back the same from an fd, a file or a variable)."""
    return secrets.token_hex(32).encode()


def new_nonce() -> bytes:
    """A fresh random challenge."""
    return secrets.token_bytes(NONCE_SIZE)


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A 32-byte key for one use of the secret (``'store'``, ``'hostproxy'``, ...), so that an
    answer of one protocol is never valid in another."""
    return hmac.new(secret, b"vkshmem key " + purpose.encode(), hashlib.sha256).digest()


def mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``label`` and ``parts`` (each length-prefixed, so no two different lists
    of parts give the same message)."""
    h = hmac.new(key, label, hashlib.sha256)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()


def verify(expected: bytes, got: bytes) -> bool:
    """Constant-time comparison of two MACs."""
    return hmac.compare_digest(expected, got)


def _check(secret: bytes, variable: str) -> bytes:
    secret = secret.strip()
    if len(secret) < MIN_SECRET:
        raise ConfigError(variable, f"the job secret is {len(secret)} bytes long; use at least "
                          f"{MIN_SECRET} random characters (e.g. python -c 'import secrets; "
                          f"print(secrets.token_hex(32))')")
    return secret


def _read_fd(environ: Mapping[str, str]) -> bytes:
    text = environ[FD_VAR].strip()
    try:
        fd = int(text)
        data = os.pread(fd, MAX_SECRET + 1, 0)
    except ValueError:
        raise ConfigError(FD_VAR, f"{text!r} is not a file descriptor number") from None
    except OSError as exc:
        raise ConfigError(FD_VAR, f"cannot read the job secret from fd {text}: "
                          f"{exc.strerror or exc} (was this process started by 'vkshmem run' "
                          f"and given its fd? a child process must be passed the fd, or "
                          f"set {SECRET_VAR} or {FILE_VAR} instead)") from None
    if len(data) > MAX_SECRET:
        raise ConfigError(FD_VAR, f"fd {text} holds more than {MAX_SECRET} bytes")
    return _check(data, FD_VAR)


def _read_file(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(FILE_VAR, f"cannot open {path!r}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(FILE_VAR, f"{path!r} is not a regular file")
        if st.st_uid != os.getuid():
            raise ConfigError(FILE_VAR, f"{path!r} is owned by uid {st.st_uid}, not by this "
                              f"user ({os.getuid()})")
        if st.st_mode & 0o077:
            raise ConfigError(FILE_VAR, f"{path!r} can be read or written by other users "
                              f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
        data = os.read(fd, MAX_SECRET + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET:
        raise ConfigError(FILE_VAR, f"{path!r} holds more than {MAX_SECRET} bytes")
    return _check(data, FILE_VAR)


def load_secret(environ: Mapping[str, str]) -> tuple[bytes, str] | None:
    """The job secret and the variable it came from, or None when none is set."""
    if environ.get(FD_VAR, "").strip():
        return _read_fd(environ), FD_VAR
    path = environ.get(FILE_VAR, "").strip()
    if path:
        return _read_file(path), FILE_VAR
    text = environ.get(SECRET_VAR, "")
    if text.strip():
        return _check(text.encode(), SECRET_VAR), SECRET_VAR
    return None


def secret_fd(secret: bytes) -> int:
    """A sealed memfd holding ``secret`` (for a launcher to pass to its PEs; the caller closes
    it). Not inheritable: pass it with ``subprocess.Popen(pass_fds=...)``."""
    fd = os.memfd_create("vkshmem-job-secret", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, secret)
        with contextlib.suppress(OSError, AttributeError):  # F_ADD_SEALS: Python >= 3.8
            import fcntl

            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return fd

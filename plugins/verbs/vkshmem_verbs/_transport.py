"""The verbs transport: one RC QP per peer (this PE's own included), driven by the caller.

Mapping of the core's contract onto ibverbs (``csrc/vkv*.c`` does the work, one cffi call per
operation with the GIL released):

* open: ``ibv_open_device`` of the rail's device, ``ibv_query_port``/``ibv_query_gid``, a PD,
  one CQ, a registered staging area, and ``n_pes`` RC QPs in RESET.
* ``register`` → ``ibv_reg_mr`` of a host segment, ``ibv_reg_dmabuf_mr`` of a segment with a
  dma-buf fd (a GPU heap); the key blob is ``SegKey`` (``_conn.py``).
* ``address`` → the port's LID/GID/MTU and one (QPN, PSN) per peer; ``connect`` moves each QP
  to INIT, RTR, RTS against the peer's QP for this PE.
* put → RDMA WRITE (inline, zero-copy from a registered segment, or through the staging
  area); get → RDMA READ; AMOs → NIC fetch-and-add / compare-and-swap on the enclosing 8
  bytes, the rest as compare-and-swap loops (``vkv_amo_run``); fence → ``IBV_SEND_FENCE`` on
  the next WR to each PE; quiet → every signaled WR completed.

No progress thread: RDMA needs none at the target, and the AMO emulation runs at the
initiator (the target's CPU never takes part). The data path ran only against the software
model of a provider (``csrc/vkv_model.c``) where this was written (no RDMA device); see
README.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from vkshmem.plugin import (
    AmoOp,
    ConfigError,
    InvalidArgumentError,
    NativeTransport,
    PeerInfo,
    SegmentInfo,
    TransportContext,
    TransportError,
    TransportSpec,
)

from . import NAME, SPEC, SYSFS, device_names, sysfs_devices
from ._conn import ConnData, PortInfo, SegKey, path, psn
from ._options import Options, parse_options
from ._verbs import ffi, lib

__all__ = ["VerbsTransport", "amo_table"]

log = logging.getLogger("vkshmem.verbs")

if any(getattr(lib, f"VK_{op.name}") != op.value for op in AmoOp):  # pragma: no cover
    raise ImportError("vkshmem_verbs: the native AMO op codes disagree with vkshmem's AmoOp")

_PLANS = {lib.VKV_PLAN_FAA: "nic fetch-add", lib.VKV_PLAN_CAS: "nic compare-swap",
          lib.VKV_PLAN_LOOP: "compare-swap loop"}


def amo_table() -> dict[tuple[str, int, int], str]:
    """How each AMO is carried: (op, width, byte offset in its 8 bytes) -> plan (the
    capability table ``stats()`` reports, from the native ``vkv_amo_plan``)."""
    ca, sw = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    return {(op.name.lower(), w, off): _PLANS[lib.vkv_amo_plan(op, w, off * 8, 1, 0, ca, sw)]
            for op in AmoOp for w in (4, 8) for off in ((0, 4) if w == 4 else (0,))}


def _missing_device(opts: Options) -> TransportError:
    names, why = device_names()
    here = sysfs_devices()
    listed = ", ".join(names or here) or "none"
    if opts.device:
        return TransportError(NAME, f"no RDMA device named {opts.device!r} (from "
                              f"{opts.source('device')}); devices here: {listed}")
    return TransportError(NAME, f"no RDMA device on this machine ({SYSFS} lists "
                          f"{', '.join(here) or 'none'}; {why}). Load the NIC's driver, or "
                          "create a soft one (`rdma link add rxe0 type rxe netdev eth0`), or "
                          "choose another transport (VKSHMEM_TRANSPORTS / VKSHMEM_RAIL<n>)")


class VerbsTransport(NativeTransport):
    """The verbs transport on one rail of one PE."""

    spec: TransportSpec = SPEC
    name = NAME

    def __init__(self, context: TransportContext) -> None:
        self.native_init()
        self._me, self._n, self._rail = context.my_pe, context.n_pes, context.rail
        self._shm = context.shm  # the core's shm path: same-node peers' AMOs are CPU atomics
        self._opts = opts = parse_options(context.rail, context.options)
        self._closed = False
        self._d: Any = ffi.NULL
        self._qps: list[Any] = []
        self._mrs: list[Any] = []
        self._keys: dict[int, dict[int, SegKey]] = {}  # pe -> seg -> key
        self._connected: set[int] = set()
        self._mixed_amo_error: str | None = None
        self._timeout_ms = int(opts.timeout * 1000)
        self.native_timeout = opts.timeout
        self._d, self.device = self._open_device(opts)
        device = self.device
        err = ffi.new("char[]", lib.VKV_ERRLEN)
        try:
            p = ffi.new("struct vkv_port *")
            lib.vkv_query(self._d, p)
            if p.state != lib.IBV_PORT_ACTIVE:
                raise TransportError(NAME, f"{device} port {opts.port} is not active (state "
                                     f"{p.state}); choose another with {opts.source('port')}")
            self._port = PortInfo(p.lid, p.port, p.link_layer, p.active_mtu, p.gid_index,
                                  bytes(p.gid), p.max_qp_rd_atom)
            self._atomic_cap = p.atomic_cap
            for _ in range(self._n):
                qp = lib.vkv_qp_new(self._d, err)
                if qp == ffi.NULL:
                    raise TransportError(NAME, f"{device}: {ffi.string(err).decode()} (depth "
                                         f"{opts.depth}, max_inline {opts.max_inline})")
                self._qps.append(qp)
            self._conn = ConnData(self._port, tuple((lib.vkv_qp_num(q), psn())
                                                    for q in self._qps))
        except BaseException:
            self.close()
            raise

    def _open_device(self, opts: Options) -> tuple[Any, str]:
        """The opened ``vkv_dev`` of the rail's device, and the device's name."""
        names, _why = device_names()
        device = opts.device or (names[0] if names else None)
        if device is None or device not in names:
            raise _missing_device(opts)
        err = ffi.new("char[]", lib.VKV_ERRLEN)
        d = lib.vkv_open(device.encode(), opts.port, opts.gid_index, opts.depth,
                         opts.max_inline, opts.staging_kib * 1024, opts.staging_slots, err)
        if d == ffi.NULL:
            raise TransportError(NAME, f"cannot open {device} port {opts.port} (gid_index "
                                 f"{opts.gid_index}): {ffi.string(err).decode()}")
        return d, device

    # -- set-up ---------------------------------------------------------------------------

    def register(self, segment: SegmentInfo) -> bytes:
        """Register the segment's memory (mapped by its owner, not by us); return its key."""
        self._live()
        dmabuf = segment.dmabuf_fd if segment.dmabuf_fd >= 0 else (
            segment.fd if segment.kind == "dmabuf" else -1)
        if segment.kind != "host" and dmabuf < 0:
            raise TransportError(NAME, f"cannot register memory of kind {segment.kind!r} "
                                 "without a dma-buf fd (host memory, or GPU memory whose "
                                 "domain exports a dma-buf)")
        err = ffi.new("char[]", lib.VKV_ERRLEN)
        mr = lib.vkv_reg(self._d, ffi.cast("void *", segment.address), segment.size, dmabuf,
                         err)
        if mr == ffi.NULL:
            raise TransportError(NAME, f"cannot register segment {segment.seg_id} "
                                 f"({segment.size} bytes) on {self.device}: "
                                 f"{ffi.string(err).decode()}")
        self._mrs.append(mr)
        key = SegKey(segment.seg_id, lib.vkv_mr_base(mr, int(dmabuf >= 0)), segment.size,
                     lib.vkv_mr_rkey(mr), dmabuf >= 0)
        return key.encode()

    def address(self) -> bytes:
        """This PE's port and one (QPN, PSN) per peer."""
        self._live()
        return self._conn.encode()

    def connect(self, peers: Mapping[int, PeerInfo]) -> None:
        """Connect the QP of every peer that published data (once) and record its keys."""
        self._live()
        err = ffi.new("char[]", lib.VKV_ERRLEN)
        shm = self._shm
        for pe, info in peers.items():
            if info.address is None:
                continue
            if pe not in self._connected:
                peer = ConnData.decode(info.address, pe, self._n)
                fields = path(self._conn, self._me, peer, pe, self._opts)
                p = ffi.new("struct vkv_path *")
                for k, v in fields.items():
                    setattr(p, k, v)
                rc = lib.vkv_qp_connect(self._d, self._qps[pe], p, err)
                if rc:
                    raise TransportError(NAME, f"cannot connect to PE {pe} on {self.device}: "
                                         f"{ffi.string(err).decode()}", status=rc)
                self._connected.add(pe)
            keys = self._keys.setdefault(pe, {})
            for seg, blob in info.rkeys.items():
                keys[seg] = SegKey.decode(blob, pe)
            if shm and info.same_node and self._opts.atomics == "nic":
                self._mixed_amo_error = (
                    "AMOs over verbs are NIC atomics, which are not atomic with the CPU "
                    "atomics VKSHMEM_SHM=1 applies on this node (this PE's own AMOs "
                    "included); set VKSHMEM_SHM=0 so every AMO goes through the NIC, or "
                    f"atomics=mixed ({self._opts.source('atomics')}) if no word is updated "
                    "both from this node and through verbs")

    # -- the data path ----------------------------------------------------------------------

    def _live(self) -> Any:
        if self._closed:
            raise TransportError(NAME, "the transport is closed")
        return self._d

    def _target(self, pe: int, seg: int, offset: int, n: int) -> tuple[Any, SegKey]:
        self._live()
        key = self._keys.get(pe, {}).get(seg)
        if pe not in self._connected or key is None:
            raise InvalidArgumentError(f"{NAME}: PE {pe} has no segment {seg} registered")
        if offset < 0 or n < 0 or offset + n > key.size:
            raise InvalidArgumentError(f"{NAME}: {n} bytes at offset {offset} are outside "
                                       f"segment {seg} of PE {pe} ({key.size} bytes)")
        return self._qps[pe], key

    def status_error(self, rc: int, doing: str, pe: int = -1, seg: int = -1, offset: int = 0,
                     nbytes: int = 0) -> BaseException:
        """The exception for status ``rc`` (``VK_ST_*`` or ``-errno``) of ``doing`` PE ``pe``:
        :meth:`NativeTransport.status_error` for a closed transport, else naming the device
        and libibverbs' last error."""
        if rc == lib.VK_ST_TIMEDOUT:
            return TransportError(NAME, f"{doing} PE {pe}: no completion in "
                                  f"{self._opts.timeout:g} s ({self._opts.source('timeout')})",
                                  status=rc)
        if rc == lib.VK_ST_CLOSED:
            return super().status_error(rc, doing, pe, seg, offset, nbytes)
        why = ffi.string(lib.vkv_last_error(self._d)).decode() if self._d != ffi.NULL else ""
        return TransportError(NAME, f"{doing} PE {pe} failed on {self.device}: "
                              f"{why or os.strerror(abs(rc))}", status=rc)

    def _check(self, rc: int, doing: str, pe: int) -> None:
        if rc:
            raise self.status_error(rc, doing, pe)

    def put(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        self._put(pe, seg, offset, src, 0)

    def put_nbi(self, pe: int, seg: int, offset: int, src: memoryview) -> None:
        self._put(pe, seg, offset, src, 1)

    def _put(self, pe: int, seg: int, offset: int, src: memoryview, nbi: int) -> None:
        qp, key = self._target(pe, seg, offset, src.nbytes)
        if src.nbytes:
            rc = lib.vkv_put(self._d, qp, key.base + offset, key.rkey, ffi.from_buffer(src),
                             src.nbytes, nbi, self._timeout_ms)
            self._check(rc, "put to", pe)

    def get(self, pe: int, seg: int, offset: int, dst: memoryview) -> None:
        qp, key = self._target(pe, seg, offset, dst.nbytes)
        if dst.nbytes:
            rc = lib.vkv_get(self._d, qp, key.base + offset, key.rkey, ffi.from_buffer(dst),
                             dst.nbytes, self._timeout_ms)
            self._check(rc, "get from", pe)

    def amo(self, pe: int, seg: int, offset: int, op: AmoOp, width: int, operand: int,
            compare: int, fetch: bool) -> int:
        if width not in (4, 8):
            raise InvalidArgumentError(f"{NAME}: AMO width {width} (4 or 8 bytes only)")
        if offset % width:
            raise InvalidArgumentError(f"{NAME}: AMO at offset {offset} is not aligned to its "
                                       f"width {width}")
        qp, key = self._target(pe, seg, offset, width)
        if self._mixed_amo_error:
            raise ConfigError("VKSHMEM_SHM", self._mixed_amo_error)
        if self._atomic_cap == lib.IBV_ATOMIC_NONE:
            raise TransportError(NAME, f"{self.device} has no atomics (IBV_ATOMIC_NONE)")
        mask = (1 << (8 * width)) - 1
        out = ffi.new("uint64_t *")
        rc = lib.vkv_amo(self._d, qp, key.base + offset, key.rkey, int(op), width,
                         operand & mask, compare & mask, self._timeout_ms, out)
        self._check(rc, "AMO on", pe)
        return int(out[0]) if fetch else 0

    def fence(self) -> None:
        """The next WR to each PE carries ``IBV_SEND_FENCE`` (after every earlier read/AMO)."""
        self._live()
        for pe in self._connected:
            lib.vkv_fence(self._d, self._qps[pe])

    def quiet(self) -> None:
        self._check(lib.vkv_quiet(self._live(), self._timeout_ms), "quiet with", self._me)

    def stats(self) -> dict[str, Any]:
        """Device, port, counters (WRs posted and completed, bytes of puts copied through the
        staging area, WRs outstanding) and the AMO capability table."""
        out = ffi.new("uint64_t[4]")
        lib.vkv_stats(self._live(), out)
        p = self._port
        return {"device": self.device, "port": p.port, "lid": p.lid, "gid": p.gid.hex(),
                "gid_index": p.gid_index, "link_layer": p.link_layer,
                "active_mtu": 128 << p.active_mtu, "atomic_cap": self._atomic_cap,
                "posted": out[0], "completed": out[1], "staged_bytes": out[2],
                "outstanding": out[3], "amo": amo_table()}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._d != ffi.NULL:
            lib.vkv_quiet(self._d, 5000)
        for qp in self._qps:
            lib.vkv_qp_free(self._d, qp)
        self._qps.clear()
        if self._d != ffi.NULL:
            lib.vkv_close(self._d)  # deregisters what is left
            self._d = ffi.NULL
        self._mrs.clear()

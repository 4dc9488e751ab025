"""The verbs transport's connection data: what each PE publishes through the bootstrap (its
port and one RC QP per peer), the key blob of a registered segment, and the path (the
``struct vkv_path`` fields) one QP takes to its peer QP, from both ends' data and the options.
Pure Python: the tests check it on every machine."""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass

from vkshmem.plugin import TransportError

from . import NAME
from ._options import Options

__all__ = ["ETHERNET", "IB", "ConnData", "PortInfo", "SegKey", "path", "psn"]

IB, ETHERNET = 1, 2  # IBV_LINK_LAYER_INFINIBAND / _ETHERNET (checked against the header)
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}  # IBV_MTU_* codes
_MAGIC = b"VKV1"
# magic, lid, port, link layer, active MTU code, GID index, max rd atomic, GID, QP count
_HEAD = struct.Struct("<4sHBBBBB16sI")
_QP = struct.Struct("<II")  # qpn, first psn
_KEY = struct.Struct("<IQQIB")  # segment id, remote address of byte 0, size, rkey, dmabuf


def psn() -> int:
    """A random first packet sequence number (24 bits)."""
    return secrets.randbits(24)


@dataclass(frozen=True)
class PortInfo:
    """This PE's port, as ``vkv_query`` reports it."""

    lid: int
    port: int
    link_layer: int
    active_mtu: int
    gid_index: int
    gid: bytes
    max_rd_atomic: int


@dataclass(frozen=True)
class ConnData:
    """A PE's published connection data: its port and, per peer PE, the QP for that peer."""

    port: PortInfo
    qps: tuple[tuple[int, int], ...]  # per peer PE: (qpn, first psn)

    def encode(self) -> bytes:
        p = self.port
        head = _HEAD.pack(_MAGIC, p.lid, p.port, p.link_layer, p.active_mtu, p.gid_index,
                          min(p.max_rd_atomic, 255), p.gid, len(self.qps))
        return head + b"".join(_QP.pack(q, s) for q, s in self.qps)

    @classmethod
    def decode(cls, blob: bytes, pe: int, n_pes: int) -> ConnData:
        """PE ``pe``'s data; a TransportError naming it if the blob is not what this version
        publishes for a job of ``n_pes``."""
        if len(blob) < _HEAD.size or blob[:4] != _MAGIC:
            raise TransportError(NAME, f"PE {pe} published connection data this version does "
                                 f"not read ({len(blob)} bytes, starting {blob[:4]!r}); is "
                                 "every PE running the same vkshmem-verbs?")
        _magic, lid, port, ll, mtu, gidx, rd, gid, n = _HEAD.unpack_from(blob)
        if n != n_pes or len(blob) != _HEAD.size + n * _QP.size:
            raise TransportError(NAME, f"PE {pe} published {n} QPs in {len(blob)} bytes for "
                                 f"a job of {n_pes} PEs")
        if ll not in (IB, ETHERNET) or mtu not in MTU_BYTES:
            raise TransportError(NAME, f"PE {pe} published link layer {ll}, MTU code {mtu}")
        qps = tuple(_QP.unpack_from(blob, _HEAD.size + i * _QP.size) for i in range(n))
        return cls(PortInfo(lid, port, ll, mtu, gidx, gid, rd), qps)


@dataclass(frozen=True)
class SegKey:
    """A registered segment as peers address it: remote address = ``base`` + offset."""

    seg_id: int
    base: int
    size: int
    rkey: int
    dmabuf: bool = False

    def encode(self) -> bytes:
        return _KEY.pack(self.seg_id, self.base, self.size, self.rkey, int(self.dmabuf))

    @classmethod
    def decode(cls, blob: bytes, pe: int) -> SegKey:
        if len(blob) != _KEY.size:
            raise TransportError(NAME, f"PE {pe} published a {len(blob)}-byte segment key "
                                 f"(this version's are {_KEY.size})")
        seg, base, size, rkey, dmabuf = _KEY.unpack(blob)
        return cls(seg, base, size, rkey, bool(dmabuf))


def path(me: ConnData, my_pe: int, peer: ConnData, pe: int, opts: Options) -> dict[str, int |
                                                                                     bytes]:
    """The ``struct vkv_path`` fields for this PE's QP to ``pe`` (``me.qps[pe]``) reaching
    ``pe``'s QP for this PE (``peer.qps[my_pe]``)."""
    mine, theirs = me.port, peer.port
    if mine.link_layer != theirs.link_layer:
        kinds = {IB: "InfiniBand", ETHERNET: "Ethernet (RoCE)"}
        raise TransportError(NAME, f"PE {pe}'s port is {kinds[theirs.link_layer]}, this PE's "
                             f"{kinds[mine.link_layer]}: they cannot be connected (choose "
                             f"the device with {opts.source('device')})")
    mtu = min(mine.active_mtu, theirs.active_mtu)
    if opts.mtu:
        mtu = min(mtu, {b: c for c, b in MTU_BYTES.items()}[opts.mtu])
    # RoCE always routes by GID; InfiniBand does where a GID index was asked for (across
    # subnets) or the peer has no LID
    is_global = (mine.link_layer == ETHERNET or opts.gid_index >= 0 or theirs.lid == 0)
    qpn, their_psn = peer.qps[my_pe]
    return {
        "qpn": qpn, "psn": their_psn, "my_psn": me.qps[pe][1], "flow_label": 0,
        "lid": theirs.lid, "gid": theirs.gid, "mtu": mtu, "is_global": int(is_global),
        "sgid_index": mine.gid_index if is_global else 0,
        "traffic_class": opts.traffic_class, "hop_limit": opts.hop_limit, "sl": opts.sl,
        "port": mine.port, "timeout": opts.ack_timeout, "retry_cnt": opts.retry_cnt,
        "rnr_retry": opts.rnr_retry, "min_rnr_timer": 12,
        "rd_atomic": max(1, min(mine.max_rd_atomic, theirs.max_rd_atomic, 16)),
    }

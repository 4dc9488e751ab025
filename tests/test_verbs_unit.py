"""Unit tests of the verbs transport that need no RDMA device (none exists on these machines).

What is real here: the spec as the entry point registers it, the rail options as the core's
``Config`` parses ``VKSHMEM_RAIL<n>``, the connection data and key blobs, the ``struct
ibv_qp_attr`` and ``struct ibv_send_wr`` the plugin's C code builds (read back field by field
through cffi, with the layout of rdma-core's ``infiniband/verbs.h``), the AMO plans and the
compare-and-swap emulation (run under contention by threads against a CPU model of the NIC's two
atomics), and the errors when no device exists. ``test_verbs_device.py`` has the rest.
"""

from __future__ import annotations

import pytest

from vkshmem.core.config import Config
from vkshmem.core.errors import ConfigError, TransportError
from vkshmem.core.plugins.loader import load_plugins
from vkshmem.core.transports.contract import AmoOp

vkshmem_verbs = pytest.importorskip("vkshmem_verbs")
from rdma import rdma_device  # noqa: E402
from vkshmem_verbs._conn import ETHERNET, IB, ConnData, PortInfo, SegKey, path  # noqa: E402
from vkshmem_verbs._options import parse_options  # noqa: E402
from vkshmem_verbs._transport import VerbsTransport  # noqa: E402
from vkshmem_verbs._verbs import ffi, lib  # noqa: E402

from vkshmem.testing import transport as contract  # noqa: E402

pytestmark = pytest.mark.timeout(120)
NO_DEVICE = pytest.mark.skipif(rdma_device()[0] is not None, reason="this machine has an "
                               "RDMA device: the no-device errors cannot happen here")


def rail_options(text: str, environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """``VKSHMEM_RAIL0=text`` through the core's parser, then the plugin's."""
    rs = Config({"VKSHMEM_RAIL0": text}).rails[0]
    assert rs.transport == "verbs"
    return parse_options(rs.index, rs.options, environ or {})


# -- the spec --------------------------------------------------------------------------------


def test_spec_is_registered_through_the_entry_point() -> None:
    reg = load_plugins(Config({}))
    spec = reg.transports["verbs"]
    assert reg.origin["verbs"] == "vkshmem-verbs"
    assert spec is vkshmem_verbs.SPEC and VerbsTransport.spec is spec
    assert spec.amo_ops == set(AmoOp) and spec.amo_widths == {4, 8} and spec.native_fence
    assert spec.memory_kinds == {"host", "dmabuf"}
    assert reg.transports["hostproxy"].priority < spec.priority < reg.transports["ofi"].priority
    assert spec.available is not None and spec.available() == (rdma_device()[0] is not None)


def test_the_device_probe_reads_sysfs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert vkshmem_verbs.sysfs_devices(str(tmp_path / "missing")) == []
    assert vkshmem_verbs.sysfs_devices(str(tmp_path)) == []
    for name in ("mlx5_1", "mlx5_0"):
        (tmp_path / name).mkdir()
    assert vkshmem_verbs.sysfs_devices(str(tmp_path)) == ["mlx5_0", "mlx5_1"]


# -- rail options ------------------------------------------------------------------------------


def test_rail_options_from_the_rail_variable() -> None:
    o = rail_options("verbs:device=mlx5_0:port=1:gid_index=3:mtu=2048:traffic_class=106:sl=3")
    assert (o.device, o.port, o.gid_index, o.mtu, o.traffic_class, o.sl) == \
        ("mlx5_0", 1, 3, 2048, 106, 3)
    assert o.source("device") == "VKSHMEM_RAIL0 (device=)" and o.source("depth") == "the default"
    d = rail_options("verbs")
    assert (d.device, d.port, d.gid_index, d.mtu, d.atomics, d.hop_limit) == \
        (None, 1, -1, 0, "nic", 64)


def test_environment_variables_fill_what_the_rail_leaves_out() -> None:
    env = {"VKSHMEM_VERBS_DEVICE": "mlx5_2", "VKSHMEM_VERBS_GID_INDEX": "1",
           "VKSHMEM_VERBS_MTU": "auto", "VKSHMEM_VERBS_PORT": "2"}
    o = rail_options("verbs:port=1", env)
    assert (o.device, o.gid_index, o.mtu, o.port) == ("mlx5_2", 1, 0, 1)
    assert o.source("device") == "VKSHMEM_VERBS_DEVICE"


@pytest.mark.parametrize("text, variable, words", [
    ("verbs:devcie=mlx5_0", "VKSHMEM_RAIL0", "unknown option 'devcie'"),
    ("verbs:port=0", "VKSHMEM_RAIL0", "port='0' is not an integer from 1 to 255"),
    ("verbs:gid_index=x", "VKSHMEM_RAIL0", "gid_index='x'"),
    ("verbs:mtu=1500", "VKSHMEM_RAIL0", "mtu='1500' (use auto or one of 256, 512"),
    ("verbs:sl=16", "VKSHMEM_RAIL0", "sl='16'"),
    ("verbs:traffic_class=256", "VKSHMEM_RAIL0", "traffic_class='256'"),
    ("verbs:timeout=0", "VKSHMEM_RAIL0", "timeout='0'"),
    ("verbs:atomics=cpu", "VKSHMEM_RAIL0", "atomics='cpu' (use nic or mixed)"),
])
def test_bad_rail_options_name_the_variable(text: str, variable: str, words: str) -> None:
    with pytest.raises(ConfigError, match=variable) as info:
        rail_options(text)
    assert words in str(info.value)


def test_a_bad_environment_value_names_its_variable() -> None:
    with pytest.raises(ConfigError, match="VKSHMEM_VERBS_RETRY_CNT"):
        rail_options("verbs", {"VKSHMEM_VERBS_RETRY_CNT": "9"})


# -- connection data ---------------------------------------------------------------------------

IB_PORT = PortInfo(lid=7, port=1, link_layer=IB, active_mtu=5, gid_index=0,
                   gid=bytes(range(16)), max_rd_atomic=16)
ROCE_PORT = PortInfo(lid=0, port=2, link_layer=ETHERNET, active_mtu=3, gid_index=3,
                     gid=bytes(10) + b"\xff\xff\x0a\x00\x00\x02", max_rd_atomic=8)


def test_connection_data_round_trips_and_is_checked() -> None:
    data = ConnData(ROCE_PORT, ((0x11, 0xabcdef), (0x12, 5), (0x13, 0)))
    blob = data.encode()
    assert ConnData.decode(blob, 1, 3) == data
    with pytest.raises(TransportError, match=r"PE 1 published 3 QPs .* for a job of 4 PEs"):
        ConnData.decode(blob, 1, 4)
    with pytest.raises(TransportError, match="PE 2 published connection data this version"):
        ConnData.decode(b"VKU1" + blob[4:], 2, 3)
    with pytest.raises(TransportError, match="PE 2"):
        ConnData.decode(blob[:-1], 2, 3)
    key = SegKey(3, 0x7f0000001000, 1 << 20, 0xdeadbeef, False)
    assert SegKey.decode(key.encode(), 1) == key
    with pytest.raises(TransportError, match="segment key"):
        SegKey.decode(key.encode() + b"x", 1)


def test_the_path_to_a_peer() -> None:
    me = ConnData(IB_PORT, ((100, 1), (101, 2)))
    peer = ConnData(PortInfo(9, 1, IB, 4, 0, bytes(16), 4), ((200, 3), (201, 4)))
    p = path(me, 0, peer, 1, rail_options("verbs:sl=2"))
    assert (p["qpn"], p["psn"], p["my_psn"], p["lid"]) == (200, 3, 2, 9)  # its QP for PE 0
    assert p["mtu"] == 4 and not p["is_global"] and p["sl"] == 2 and p["rd_atomic"] == 4
    p = path(me, 0, peer, 1, rail_options("verbs:mtu=1024:gid_index=0:traffic_class=106"))
    assert p["mtu"] == 3 and p["is_global"] and p["traffic_class"] == 106
    roce = ConnData(ROCE_PORT, ((300, 7), (301, 8)))
    p = path(roce, 1, roce, 0, rail_options("verbs"))  # RoCE: always by GID
    assert p["is_global"] and p["gid"] == ROCE_PORT.gid and p["sgid_index"] == 3
    with pytest.raises(TransportError, match="PE 1's port is InfiniBand, this PE's Ethernet"):
        path(roce, 0, peer, 1, rail_options("verbs"))


def test_qp_transitions_carry_the_path() -> None:
    fields = path(ConnData(ROCE_PORT, ((300, 7), (301, 8))), 0,
                  ConnData(ROCE_PORT, ((400, 9), (401, 10))), 1,
                  rail_options("verbs:traffic_class=106:hop_limit=5:ack_timeout=18:mtu=512"))
    p = ffi.new("struct vkv_path *")
    for k, v in fields.items():
        setattr(p, k, v)
    a, mask = ffi.new("struct ibv_qp_attr *"), ffi.new("int *")
    lib.vkv_init_attr(a, mask, 2)
    assert lib.vkv_attr_state(a) == lib.IBV_QPS_INIT and a.port_num == 2 and a.pkey_index == 0
    assert a.qp_access_flags == (lib.IBV_ACCESS_LOCAL_WRITE | lib.IBV_ACCESS_REMOTE_WRITE |
                                 lib.IBV_ACCESS_REMOTE_READ | lib.IBV_ACCESS_REMOTE_ATOMIC)
    lib.vkv_rtr_attr(a, mask, p)
    assert lib.vkv_attr_state(a) == lib.IBV_QPS_RTR and lib.vkv_attr_path_mtu(a) == lib.IBV_MTU_512
    assert (a.dest_qp_num, a.rq_psn, a.max_dest_rd_atomic) == (400, 9, 8)
    ah = a.ah_attr
    assert ah.is_global == 1 and ah.port_num == 2 and ah.dlid == 0
    assert bytes(ah.grh.dgid.raw) == ROCE_PORT.gid and ah.grh.sgid_index == 3
    assert (ah.grh.traffic_class, ah.grh.hop_limit) == (106, 5)
    assert mask[0] & lib.IBV_QP_AV and mask[0] & lib.IBV_QP_PATH_MTU and \
        mask[0] & lib.IBV_QP_DEST_QPN and mask[0] & lib.IBV_QP_RQ_PSN
    lib.vkv_rts_attr(a, mask, p)
    assert lib.vkv_attr_state(a) == lib.IBV_QPS_RTS
    assert (a.sq_psn, a.timeout, a.retry_cnt, a.rnr_retry, a.max_rd_atomic) == (8, 18, 7, 7, 8)
    assert mask[0] & lib.IBV_QP_SQ_PSN and mask[0] & lib.IBV_QP_MAX_QP_RD_ATOMIC


# -- work requests -----------------------------------------------------------------------------


@pytest.mark.parametrize("read", [False, True])
def test_rdma_work_requests_field_by_field(read: bool) -> None:
    wr, sge = ffi.new("struct ibv_send_wr *"), ffi.new("struct ibv_sge *")
    opcode = lib.IBV_WR_RDMA_READ if read else lib.IBV_WR_RDMA_WRITE
    flags = lib.IBV_SEND_SIGNALED | (0 if read else lib.IBV_SEND_INLINE)
    lib.vkv_wr_rdma(wr, sge, opcode, 42, 0x1000, 300, 0x55, 0x7f00deadbe00, 0xabc, flags)
    assert wr.wr_id == 42 and wr.next == ffi.NULL and wr.num_sge == 1 and wr.sg_list == sge
    assert lib.vkv_wr_opcode(wr) == opcode and wr.send_flags == flags
    assert (sge.addr, sge.length, sge.lkey) == (0x1000, 300, 0x55)
    assert lib.vkv_wr_remote_addr(wr, 0) == 0x7f00deadbe00 and lib.vkv_wr_rkey(wr, 0) == 0xabc


@pytest.mark.parametrize("cas", [False, True])
def test_atomic_work_requests_field_by_field(cas: bool) -> None:
    wr, sge = ffi.new("struct ibv_send_wr *"), ffi.new("struct ibv_sge *")
    opcode = lib.IBV_WR_ATOMIC_CMP_AND_SWP if cas else lib.IBV_WR_ATOMIC_FETCH_AND_ADD
    flags = lib.IBV_SEND_SIGNALED | lib.IBV_SEND_FENCE
    lib.vkv_wr_atomic(wr, sge, opcode, 7, 0x2000, 0x66, 0x10008, 0x99, 1 << 40, 3, flags)
    assert lib.vkv_wr_opcode(wr) == opcode and wr.send_flags == flags and wr.num_sge == 1
    assert (sge.addr, sge.length, sge.lkey) == (0x2000, 8, 0x66)  # the old value lands here
    assert lib.vkv_wr_remote_addr(wr, 1) == 0x10008 and lib.vkv_wr_rkey(wr, 1) == 0x99
    assert lib.vkv_wr_compare_add(wr) == 1 << 40 and lib.vkv_wr_swap(wr) == (3 if cas else 0)


def test_mtu_codes() -> None:
    assert [lib.vkv_mtu_code(b) for b in (256, 512, 1024, 2048, 4096, 1500)] == \
        [lib.IBV_MTU_256, lib.IBV_MTU_512, lib.IBV_MTU_1024, lib.IBV_MTU_2048, lib.IBV_MTU_4096, 0]
    assert [lib.vkv_mtu_bytes(c) for c in range(1, 6)] == [256, 512, 1024, 2048, 4096]


# -- no device ---------------------------------------------------------------------------------


@NO_DEVICE
def test_a_named_device_that_does_not_exist_is_named() -> None:
    ctx = contract.context(0, 1, options={"device": "mlx5_0", "port": "1"})
    with pytest.raises(TransportError, match=r"no RDMA device named 'mlx5_0' \(from "
                       r"VKSHMEM_RAIL0 \(device=\)\); devices here: none"):
        vkshmem_verbs.SPEC.factory(ctx)


@NO_DEVICE
def test_no_device_at_all_says_why_and_what_to_do() -> None:
    with pytest.raises(TransportError) as info:
        vkshmem_verbs.SPEC.factory(contract.context(0, 1))
    text = str(info.value)
    assert "no RDMA device on this machine (/sys/class/infiniband lists none" in text
    assert "ibv_get_device_list" in text and "rdma link add" in text
    assert "VKSHMEM_TRANSPORTS" in text


def run_pe(env: dict[str, str]):  # type: ignore[no-untyped-def]
    from test_multipe import launch

    return launch("rma", 1, {"VKSHMEM_SHM": "0", **env}, timeout=60)


@NO_DEVICE
def test_the_automatic_choice_passes_over_verbs_silently() -> None:
    r = run_pe({"VKSHMEM_PLUGINS_DENY": "ucx,ofi"})  # verbs and hostproxy remain
    assert r.returncode == 0, r.stdout + r.stderr
    assert "routes: ['hostproxy']" in r.stdout
    assert "verbs" not in r.stderr  # no warning that it was skipped


@NO_DEVICE
def test_naming_verbs_without_a_device_is_an_error_that_names_it() -> None:
    r = run_pe({"VKSHMEM_RAIL0": "verbs:device=mlx5_0:port=1:gid_index=3"})
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "no RDMA device named 'mlx5_0' (from VKSHMEM_RAIL0 (device=))" in out, out
    assert "named by VKSHMEM_RAIL0" in out


@NO_DEVICE
def test_vkshmem_info_says_it_is_not_available_here() -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "vkshmem", "info"], capture_output=True,
                       text=True, timeout=60)
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("verbs ")
                and "priority 30" in x)
    assert "[not available here: left out of the automatic choice]" in line

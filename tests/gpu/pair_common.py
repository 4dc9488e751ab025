"""What the two-GPU all-reduce probes (pair_phase_probe.py, pair_pipe_probe.py; scripts, which
find this module beside them) need of either GPU domain's heaps: the CUDA handles and
addresses, and the domain's reduce kernel with its launch shape."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from vkshmem import shmem


def ok(res: Any) -> Any:
    """The value of a cuda-bindings call's (result, value...) tuple, asserting success."""
    err, *rest = res if isinstance(res, tuple) else (res,)
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


class PairHeaps(NamedTuple):
    heap: Any
    dom: Any
    name: str
    link: Any  #: the Vulkan domain's CUDA link to the peer, None on the cuda domain
    cu: Any  #: cuda-bindings' driver module
    ctx: Any
    device: Any  #: the CUdevice
    local: int  #: this PE's heap as CUDA sees it
    remote: int  #: the peer's heap as mapped here
    fn: Any  #: the reduce kernel of float32 sums
    grid: int  #: its blocks for ``half`` elements
    block: int
    sms: int


def pair_heaps(array: Any, peer: int, half: int) -> PairHeaps:
    """The heaps of ``array``'s domain between this PE and ``peer`` on the other GPU."""
    heap = shmem._state.rt.domains.heaps[array.domain.spec.name]
    dom = heap.domain
    f32 = np.dtype(np.float32)
    link = heap.links[peer] if heap.links else None
    if link is not None:  # the Vulkan domain's CUDA link
        hub = link.hub
        fn, grid, block = hub.fold_launch("sum", f32, half)
        return PairHeaps(heap, dom, dom.spec.name, link, hub.cu, hub.view.context,
                         hub.view.device, hub.view.pointer, link._ptr, fn, grid, block,
                         hub._kernels().sms)
    dev = dom.device  # the cuda domain: the peer's heap mapped (route direct)
    return PairHeaps(heap, dom, dom.spec.name, None, dev.cu, dev.ctx, dev.dev, dom.local.va,
                     heap.direct[peer].va, dev.cu.CUfunction(dom.reducer.fn("sum", f32, 2)),
                     dom.reducer.grid(half, np.float32, 512, 2), 512, dev.sms)

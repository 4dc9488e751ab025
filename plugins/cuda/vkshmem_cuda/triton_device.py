"""The device API for Triton kernels on the ``cuda`` domain (torch symmetric memory's model).

A Triton kernel takes peers' memory as ordinary tensors: ``shmem.ptr(a, pe)`` of a ``cuda``
array is a view of PE ``pe``'s copy mapped into this process (same GPU, or another GPU of the
node over NVLink/P2P), which ``torch.from_dlpack(view)`` wraps without a copy.
Loads and stores through it are puts and gets; these ``@triton.jit`` helpers add what the
kernel needs to synchronise, at system scope (atomic with every GPU's and the host's atomics;
int32 or int64 words):

- :func:`signal_add`, :func:`signal_set`: release the data stored before, then update the
  peer's signal word (put_signal is a store loop, ``tl.debug_barrier()`` so that every warp
  of the program has stored, then one of them: a scalar atomic runs in one thread, and its
  release orders only that thread's stores);
- :func:`signal_wait_until_ge`: spin (bounded by ``max_spins``) until this PE's word reaches
  a value, with acquire semantics; returns whether it did;
- :func:`fetch_add`, :func:`compare_swap`: AMOs on any PE's word;
- :func:`fence`: order the thread's earlier stores before its later ones at system scope
  (``fence.sc.sys``; nvshmem_fence / nvshmem_quiet for stores).

Importing this module imports Triton (``pip install triton``, with PyTorch).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["compare_swap", "fence", "fetch_add", "signal_add", "signal_set",
           "signal_wait_until_ge"]


@triton.jit
def fence():
    """System-scope fence: earlier stores of this thread are visible everywhere before its
    later ones."""
    tl.inline_asm_elementwise("fence.sc.sys;\n\tmov.u32 $0, $1;", "=r,r",
                              [tl.zeros((1,), tl.int32)], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def signal_add(sig_ptr, value):
    """Release, then add ``value`` to the signal word at ``sig_ptr`` (any PE's)."""
    tl.atomic_add(sig_ptr, value, sem="release", scope="sys")


@triton.jit
def signal_set(sig_ptr, value):
    """Release, then set the signal word at ``sig_ptr`` (any PE's) to ``value``."""
    tl.atomic_xchg(sig_ptr, value, sem="release", scope="sys")


@triton.jit
def fetch_add(ptr, value):
    """Atomic fetch-and-add on any PE's word (system scope); returns the old value."""
    return tl.atomic_add(ptr, value, sem="acq_rel", scope="sys")


@triton.jit
def compare_swap(ptr, cond, value):
    """Atomic compare-and-swap on any PE's word (system scope); returns the old value."""
    return tl.atomic_cas(ptr, cond, value, sem="acq_rel", scope="sys")


@triton.jit
def signal_wait_until_ge(sig_ptr, value, max_spins):
    """Wait until this PE's signal word at ``sig_ptr`` is at least ``value`` (acquire), at
    most ``max_spins`` polls; returns whether it got there."""
    seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < value) & (spins < max_spins):
        seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
        spins += 1
    return seen >= value

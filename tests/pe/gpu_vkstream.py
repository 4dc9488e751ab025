"""Vulkan streams (``shmem.gpu_stream()``, ``vkshmem.gpu.Stream``) on the Vulkan domain: a user
kernel writes a block on stream ``s``, ``put_signal(stream=s)`` sends it to the next PE, whose
``signal_wait_until(stream=s2)`` orders a kernel on ``s2`` that transforms it; the host checks
after ``s2.synchronize()``, and that the stream calls were enqueued (submissions counted), not
synchronized. Then: calls return before the GPU ran them (``query()`` False while a stream
wait spins on a word the host sets later); AMOs, get, host-heap puts and quiet on a stream;
a stream wait that times out raises WaitTimeoutError (once) and the stream goes on; the
fallbacks (barrier, collective, a non-symmetric host array, another stream object) give the
blocking calls' values; 1000 stream AMOs leave at most MAX_IN_FLIGHT command buffers.
Kernel: tests/gpu/shaders/stream_kernel.comp. Runs on lavapipe (tests/test_gpu_vkstream.py),
with the validation layer on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _common import check

from vkshmem import shmem
from vkshmem.core.errors import WaitTimeoutError
from vkshmem.gpu import Stream
from vkshmem.gpu.vk.timeline import MAX_IN_FLIGHT

me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n
KERNEL = Path(__file__).parent.parent / "gpu" / "shaders" / "stream_kernel.spv"
N = 300
GROUPS = -(-N // 64)
idx = np.arange(N, dtype=np.uint32)

src = shmem.zeros(N, np.uint32, domain="gpu")
dst = shmem.zeros(N, np.uint32, domain="gpu")
res = shmem.zeros(N, np.uint32, domain="gpu")
sig = shmem.new_signal(domain="gpu")
flag = shmem.new_signal(domain="gpu")
words = shmem.zeros(4, np.uint64, domain="gpu")
hsrc = shmem.array(np.arange(8, dtype=np.int64) + 100 * me)  # symmetric host arrays
hdst = shmem.zeros(8, np.int64)
kernel = shmem.gpu_kernel(KERNEL)
s = shmem.gpu_stream()
s2 = shmem.gpu_stream(name="consumer")
check(isinstance(s, Stream) and s.device is kernel.device, f"gpu_stream gave {s!r}")
print(f"PE {me} gpu_vkstream on {s.device.info.name}", flush=True)


def produce(salt: int, stream: Stream) -> None:
    kernel.dispatch(GROUPS, push=shmem.pack_push(np.uint64(0), np.uint64(src.offset),
                                                 np.uint32(N), np.uint32(0), np.uint32(salt)),
                    stream=stream)


def consume(stream: Stream) -> None:
    kernel.dispatch(GROUPS, push=shmem.pack_push(np.uint64(dst.offset), np.uint64(res.offset),
                                                 np.uint32(N), np.uint32(1), np.uint32(0)),
                    stream=stream)


def submitted(stream: Stream) -> int:
    return stream.stats()["submitted"]


# 1. kernel -> put_signal on s; wait -> kernel on s2: ordered on the GPU, no host wait
mapped_right = shmem.ptr(dst, right) is not None
maps = shmem.zeros(1, np.int64)  # whether the left PE maps this one (imports can fail alone)
maps[0] = mapped_right
shmem.barrier_all()
got1 = np.zeros(1, np.int64)
shmem.get(got1, maps, left)
left_maps_me = bool(got1[0])
if not mapped_right:
    print(f"PE {me}: PE {right}'s GPU heap is not mapped here; put_signal falls back", flush=True)
for rnd, salt in enumerate((7, 1000)):
    shmem.barrier_all()  # every PE's target and signal are ready
    k0, k1 = submitted(s), submitted(s2)
    produce(salt, s)
    shmem.put_signal(dst, src, right, sig, rnd + 1, shmem.SIGNAL_SET, stream=s)
    shmem.signal_wait_until(sig, shmem.CMP.EQ, rnd + 1, stream=s2)
    consume(s2)
    # enqueued: the kernel, the copy and the signal's AMO on s; the wait and the kernel on s2.
    # Where the right PE's heap is not mapped here (an import the driver refused: lavapipe does
    # so now and then under load), put_signal synchronizes s and goes the blocking route.
    on_s = 3 if mapped_right else 1
    check(submitted(s) - k0 == on_s and submitted(s2) - k1 == 2,
          f"round {rnd}: {submitted(s) - k0} submissions on s, {submitted(s2) - k1} on s2")
    s2.synchronize()
    want = 3 * (salt + 65536 * left + idx) + 1
    check(np.array_equal(res.to_numpy(), want.astype(np.uint32)),
          f"round {rnd}: kernel after the stream wait saw {res.to_numpy()[:4]}")
    s.synchronize()
    check(int(sig.to_numpy()[0]) == rnd + 1, "signal value")

# 2. calls return before the GPU ran them: the stream waits for a word the host sets later
shmem.barrier_all()
shmem.signal_wait_until(flag, shmem.CMP.EQ, 5, stream=s)
# a put the stream enqueues (one to an unmapped peer would synchronize s: wait for the flag)
mine = shmem.zeros(4, np.uint32, domain="gpu")
if mapped_right:
    shmem.put(dst[:4], src[:4], right, stream=s)
else:
    shmem.put(mine, src[:4], me, stream=s)
check(not s.query(), "query() said done while the stream waited for the host")
shmem.signal_set(flag, 5, me)  # blocking, from the host
s.synchronize()
check(s.query(), "query() after synchronize")
shmem.barrier_all()
if left_maps_me:
    check(np.array_equal(dst.to_numpy()[:4], (1000 + 65536 * left + idx[:4]).astype(np.uint32)),
          "the put after the released wait")
if not mapped_right:
    check(np.array_equal(mine.to_numpy(), (1000 + 65536 * me + idx[:4]).astype(np.uint32)),
          "the local put after the released wait")

# 3. AMOs, get, host-heap put/get and quiet on a stream
shmem.barrier_all()
shmem.atomic_add(words[0:1], 3, right, stream=s)
shmem.atomic_or(words[1:2], 1 << me, right, stream=s)
shmem.signal_add(words[2:3], 10, right, stream=s)
shmem.atomic_set(words[3:4], 40 + me, right, stream=s)
got = shmem.zeros(N, np.uint32, domain="gpu")
shmem.get(got, src, right, stream=s)
shmem.put(hdst, hsrc, right, stream=s)  # host heap -> host heap: not a GPU array (fallback)
shmem.quiet(stream=s)
s.synchronize()
shmem.barrier_all()
w = words.to_numpy()
check(w[0] == 3 and w[1] == 1 << left and w[2] == 10 and w[3] == 40 + left, f"AMOs: {w}")
check(np.array_equal(got.to_numpy(), (1000 + 65536 * right + idx).astype(np.uint32)),
      "get on a stream")
check(np.array_equal(hdst, np.arange(8) + 100 * left), f"host put: {hdst}")
g8 = shmem.zeros(8, np.int64, domain="gpu")
k0 = submitted(s)
shmem.put(g8, hsrc, right, stream=s)  # symmetric host -> GPU: one DMA on the stream
enq_host = submitted(s) - k0
shmem.barrier_all(stream=s)  # fallback: synchronize s, blocking barrier
check(np.array_equal(g8.to_numpy(), np.arange(8) + 100 * left), f"host->GPU put: {g8}")
print(f"PE {me}: symmetric host -> GPU put on a stream: "
      f"{'enqueued' if enq_host else 'fallback'}", flush=True)

# 4. fallbacks give the blocking calls' values
class UserStream:
    synced = 0

    def synchronize(self) -> None:
        UserStream.synced += 1


u = UserStream()
shmem.put(dst[:N], src, right, stream=u)  # not a Vulkan stream: synchronize, blocking put
tmp = np.arange(N, dtype=np.uint32) + 7  # not symmetric: the stream can't DMA it
shmem.put(res, tmp, right, stream=s)
total = shmem.zeros(N, np.uint32, domain="gpu")
shmem.sum_reduce(total, src, stream=s)  # collective: fallback
shmem.barrier_all(stream=s)
check(UserStream.synced >= 1, "the user's stream object was synchronized")
check(np.array_equal(res.to_numpy(), np.arange(N, dtype=np.uint32) + 7), "pageable put")
check(np.array_equal(dst.to_numpy(), (1000 + 65536 * left + idx).astype(np.uint32)),
      "fallback put")
want = sum((1000 + 65536 * p + idx).astype(np.uint64) for p in range(n)).astype(np.uint32)
check(np.array_equal(total.to_numpy(), want), "sum_reduce on a stream")

# 5. a stream wait that times out: WaitTimeoutError at synchronize, once; the stream goes on
streams = src.domain.streams
streams.wait_timeout = 0.5
shmem.signal_wait_until(flag, shmem.CMP.EQ, 99, stream=s2)
try:
    s2.synchronize()
    raise AssertionError(f"PE {me}: the stream wait did not time out")
except WaitTimeoutError as exc:
    check("did not become == 99" in str(exc) and "VKSHMEM_WAIT_TIMEOUT" in str(exc), str(exc))
s2.synchronize()  # raised once
shmem.signal_wait_until(flag, shmem.CMP.EQ, 5, stream=s2)  # satisfied: no error
s2.synchronize()
streams.wait_timeout = 60.0

# 6. no leak: 1000 stream AMOs
shmem.barrier_all()
for _ in range(1000):
    shmem.atomic_add(words[0:1], 1, me, stream=s)
st = s.stats()
check(st["command_buffers"] <= MAX_IN_FLIGHT and st["semaphores"] <= 2, f"held: {st}")
s.synchronize()
check(int(words.to_numpy()[0]) == 1003, f"1000 stream AMOs: {words.to_numpy()[0]}")
with shmem.gpu_stream() as s3:
    shmem.atomic_add(words[0:1], 1, me, stream=s3)
check(s3.closed and s3.stats()["command_buffers"] == 0, "closed by with")
s.close()
s2.close()
shmem.barrier_all()
print(f"gpu_vkstream ok: {st}", flush=True)
shmem.finalize()

"""How every side of ``vkshmem bench`` runs a plan item, whatever library carries it.

A side subclasses :class:`Pattern` and supplies the operations (one call per timed
operation); the pattern decides who runs what and which process reports:

* point to point (``rma``, ``bw``, ``rate``, ``amo``): rank 0 repeats the operation against
  rank 1 (itself at 1 rank) while the others wait in the barrier; rank 0's samples, divided
  by the window for the windowed tests;
* ``signal``: a ping-pong between ranks 0 and 1; half of a round trip per sample (a whole
  one at 1 rank, where rank 0 signals itself);
* ``coll``: every rank times the same loop; each sample is the mean over the ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .spec import BENCHES, Item, Plan

__all__ = ["Op", "Pattern", "measure"]

Op = Callable[[], Any]


def measure(op: Op, iters: int, warmup: int, samples: int, sync: Op) -> list[float]:
    """Seconds per call of ``op``: ``warmup`` untimed calls, then ``samples`` loops of
    ``iters`` calls, each loop started after ``sync()``."""
    for _ in range(warmup):
        op()
    out = []
    for _ in range(samples):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        out.append((time.perf_counter() - t0) / iters)
    return out


class Pattern:
    """The measurement patterns; subclasses set ``me``, ``n``, ``plan`` and the hooks."""

    me: int
    n: int
    plan: Plan
    seq: int = 0  # the last signal value of the ping-pong (the same on both ranks)

    @property
    def peer(self) -> int:
        return 1 if self.n > 1 else 0

    def barrier(self) -> None:
        raise NotImplementedError

    def p2p_op(self, item: Item) -> Op:
        """The operation rank 0 repeats for a point-to-point benchmark."""
        raise NotImplementedError

    def coll_op(self, item: Item) -> Op:
        """The collective every rank repeats."""
        raise NotImplementedError

    def mean_over_ranks(self, times: list[float]) -> list[float]:
        """Collective: the element-wise mean of every rank's ``times``."""
        raise NotImplementedError

    def signal_ops(self, item: Item, to: int) -> tuple[Op, Op]:
        """(send, wait): send ``item.size`` bytes and then the signal ``self.seq`` to rank
        ``to``; wait until this rank's signal reaches ``self.seq``."""
        raise NotImplementedError

    def _idle(self) -> None:
        for _ in range(self.plan.samples):
            self.barrier()

    def run(self, item: Item) -> list[float] | None:
        """Measure ``item`` (collective); rank 0 returns the samples, in seconds per
        operation, the others None."""
        group = BENCHES[item.bench].group
        samples = self.plan.samples
        if group == "coll":
            mean = self.mean_over_ranks(measure(self.coll_op(item), item.iters, item.warmup,
                                                samples, self.barrier))
            return mean if self.me == 0 else None
        if group == "signal":
            return self._pingpong(item)
        out = None
        if self.me == 0:
            out = measure(self.p2p_op(item), item.iters, item.warmup, samples, self.barrier)
            if group in ("bw", "rate"):
                out = [t / self.plan.window for t in out]
        else:
            self._idle()
        self.barrier()
        return out

    def _pingpong(self, item: Item) -> list[float] | None:
        if self.me not in (0, self.peer):
            self._idle()
            self.barrier()
            return None
        send, wait = self.signal_ops(item, self.peer if self.me == 0 else 0)

        def ping() -> None:  # rank 0: send, then wait for the answer
            self.seq += 1
            send()
            wait()

        def pong() -> None:  # rank 1: wait, then answer
            self.seq += 1
            wait()
            send()

        out = measure(ping if self.me == 0 else pong, item.iters, item.warmup,
                      self.plan.samples, self.barrier)
        self.barrier()
        if self.me != 0:
            return None
        return [t / 2 for t in out] if self.n > 1 else out

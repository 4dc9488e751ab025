"""The OpenSHMEM side of ``vkshmem bench``: one program run on every PE.

``python -m vkshmem._bench.kernels PLAN.json [--impl vkshmem|shmem4py]`` under ``vkshmem run``
(vkshmem) or ``oshrun`` (shmem4py on Open MPI's OSHMEM). It uses only names that shmem4py
has, so the same kernels measure both libraries. Who measures what is
:class:`~vkshmem._bench.pattern.Pattern`'s; PE 0 prints one ``MARK {json}`` line per plan item
with the seconds per operation of each timed sample.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

import numpy as np

from .pattern import Op, Pattern
from .spec import MARK, META, Item, Plan


def bind_to_core(rank: int, npes: int) -> None:
    """Pin this process to one core when there is one per PE (as MPI launchers do)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= npes:
        os.sched_setaffinity(0, {cores[rank % len(cores)]})


class Kernels(Pattern):
    """The measurements of one PE, on the API module ``shmem`` (vkshmem's or shmem4py's)."""

    def __init__(self, shmem: Any, plan: Plan) -> None:
        self.s = s = shmem
        self.plan = plan
        self.me, self.n = s.my_pe(), s.n_pes()
        kw = {} if plan.domain == "host" else {"domain": plan.domain}
        room = plan.max_size * max(self.n, 1)
        self.a = s.zeros(room, np.uint8, **kw)  # remote target, collective target
        self.b = s.zeros(room, np.uint8, **kw)  # local source (symmetric: OSU's buffers are)
        self.word = s.zeros(1, np.int64, **kw)  # the AMO target
        nf = max(1, plan.max_size // 8)
        self.ft = s.zeros(nf, np.float64, **kw)
        self.fs = s.ones(nf, np.float64, **kw)
        self.sig = s.new_signal()
        self.tsrc = s.zeros(plan.samples, np.float64)
        self.tdst = s.zeros(plan.samples, np.float64)
        s.barrier_all()

    # -- the operations ----------------------------------------------------------------------

    def p2p_op(self, item: Item) -> Op:
        """The operation PE 0 repeats for a point-to-point benchmark."""
        s, p, n = self.s, self.peer, item.size
        dst, src = self.a[:n], self.b[:n]
        if item.bench == "put_lat":
            put, quiet = s.put, s.quiet

            def put_quiet() -> None:
                put(dst, src, p)
                quiet()
            return put_quiet
        if item.bench == "get_lat":
            get = s.get
            return lambda: get(src, dst, p)
        if item.bench in ("put_bw", "put_rate", "get_bw", "get_rate"):
            return self._window(item)
        return self._amo(item.bench)

    def _window(self, item: Item) -> Op:
        s, p, n, w = self.s, self.peer, item.size, self.plan.window
        dst, src = self.a[:n], self.b[:n]
        call = s.put_nbi if item.bench.startswith("put") else s.get_nbi
        a, b = (dst, src) if item.bench.startswith("put") else (src, dst)
        quiet = s.quiet
        rng = range(w)

        def window() -> None:
            for _ in rng:
                call(a, b, p)
            quiet()
        return window

    def _amo(self, name: str) -> Op:
        s, w, p = self.s, self.word, self.peer
        quiet = s.quiet
        if name == "compare_swap":
            cas = s.atomic_compare_swap
            return lambda: cas(w, 0, 0, p)
        value = {"set": 0, "swap": 0, "add": 1, "fetch_add": 1, "and": -1, "fetch_and": -1,
                 "or": 0, "fetch_or": 0, "xor": 1, "fetch_xor": 1}
        fn = getattr(s, f"atomic_{name}")
        if name in ("fetch", "inc", "fetch_inc"):
            if name == "inc":
                def inc_quiet() -> None:
                    fn(w, p)
                    quiet()
                return inc_quiet
            return lambda: fn(w, p)
        v = value[name]
        if name.startswith(("fetch", "swap")):
            return lambda: fn(w, v, p)

        def amo_quiet() -> None:
            fn(w, v, p)
            quiet()
        return amo_quiet

    def coll_op(self, item: Item) -> Op:
        s, n, size = self.s, self.n, item.size
        if item.bench == "barrier":
            return s.barrier_all
        if item.bench == "broadcast":
            t, src = self.a[:size], self.b[:size]
            bcast = s.broadcast
            return lambda: bcast(t, src, 0)
        if item.bench == "reduce":
            c = size // 8
            t, src = self.ft[:c], self.fs[:c]
            red = s.sum_reduce
            return lambda: red(t, src)
        if item.bench == "fcollect":
            t, src = self.a[:n * size], self.b[:size]
            fc = s.fcollect
            return lambda: fc(t, src)
        t, src = self.a[:n * size], self.b[:n * size]
        a2a = s.alltoall
        return lambda: a2a(t, src)

    def barrier(self) -> None:
        self.s.barrier_all()

    def mean_over_ranks(self, times: list[float]) -> list[float]:
        self.tsrc[:] = times
        self.s.barrier_all()
        self.s.sum_reduce(self.tdst, self.tsrc)
        return [float(t) / self.n for t in self.tdst]

    def signal_ops(self, item: Item, to: int) -> tuple[Op, Op]:
        s, sig, n = self.s, self.sig, item.size
        dst, src = self.a[:n], self.b[:n]
        put_signal, wait, set_, ge = s.put_signal, s.signal_wait_until, s.SIGNAL.SET, s.CMP.GE
        return (lambda: put_signal(dst, src, to, sig, self.seq, set_),
                lambda: wait(sig, ge, self.seq))


def _describe(impl: str, shmem: Any, plan: Plan) -> dict[str, Any]:
    if impl == "shmem4py":
        mod = importlib.import_module("shmem4py")
        return {"impl": impl, "label": f"shmem4py {getattr(mod, '__version__', '?')}",
                "library": f"{shmem.info_get_name()} "
                           f"{'.'.join(map(str, shmem.info_get_version()))}",
                "npes": shmem.n_pes(), "domain": plan.domain}
    from .. import __version__

    routes = "?"
    try:
        routes = ", ".join(sorted({r.name for r in shmem._state.rt.routing.routes}))
    except AttributeError:
        pass
    return {"impl": impl, "label": f"vkshmem {__version__}", "library": f"routes: {routes}",
            "routes": routes, "npes": shmem.n_pes(), "domain": plan.domain}


def main(argv: list[str] | None = None) -> int:
    """Run every item of the plan; PE 0 prints the results."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", help="the plan (JSON) written by 'vkshmem bench'")
    ap.add_argument("--impl", choices=("vkshmem", "shmem4py"), default="vkshmem")
    args = ap.parse_args(argv)
    plan = Plan.load(args.plan)
    if plan.bind and args.impl == "vkshmem":  # before the runtime starts its threads
        # (oshrun binds shmem4py's PEs itself: --bind-to core)
        bind_to_core(int(os.environ.get("VKSHMEM_PE", "0")),
                     int(os.environ.get("VKSHMEM_NPES", "1")))
    if args.impl == "shmem4py":
        shmem = importlib.import_module("shmem4py.shmem")
    else:
        shmem = importlib.import_module("vkshmem.shmem")
    k = Kernels(shmem, plan)
    if k.me == 0:
        print(META + json.dumps(_describe(args.impl, shmem, plan)), flush=True)
    for item in plan.items:
        out = k.run(item)
        if out is not None:
            print(MARK + json.dumps({"bench": item.bench, "size": item.size,
                                     "iters": item.iters, "samples": out}), flush=True)
    shmem.barrier_all()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

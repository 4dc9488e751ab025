"""Soak test (not run in CI): a randomized, self-checking workload at N PEs per transport.

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--npes 4] [--transports shm,hostproxy,ucx]
                                        [--seed 1] [--json out.json]

For each transport the driver runs ``vkshmem run -n N`` of this same file (``--worker``).
Every PE then repeats *rounds* until the time is up (PE 0 decides, by broadcast), each round:

A. **puts** (blocking and ``put_nbi`` + ``quiet``) of random lengths (1 word to 32 KiB) into
   this PE's row of a mailbox on random PEs; every word is a function of (sender, receiver,
   round, index); barrier;
B. each PE **checks its mailbox** (a row whose words are all from an older round is a *lost*
   update, one that mixes rounds a *torn* one), **gets** random slices of other PEs' mailboxes
   and checks them the same way; **AMOs** (fetch_add, add, inc, compare-swap loops) on random
   PEs' counters, tallied; **locks**: increments of a plain word on PE 0 under a lock (get, +1,
   put, quiet); **signals**: ``put_signal`` of a block to the next PE, which waits for the
   signal and checks the block; barrier;
C. **collectives**: ``sum_reduce`` of the tallies (every counter must have grown by exactly the
   increments sent to it), of a random vector (checked against the sum computed locally),
   ``broadcast`` from a random root and ``fcollect`` (both checked); PE 0 checks the locked
   word.

Each PE samples its resident set size (``/proc/self/statm``) every few seconds. At the end each
PE prints one ``SOAK {json}`` line; the driver prints, per transport: rounds, operations by kind,
errors (lost, torn, wrong values: the goal is 0), and RSS after warm-up (the first 10 % of the
time), at the end and its growth, per PE. Run under ``--minutes 10`` for the issue's soak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODES = {
    "shm": {"VKSHMEM_SHM": "1"},
    "hostproxy": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "hostproxy"},
    "ucx": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx"},
    "ucx-tcp": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ucx", "UCX_TLS": "tcp,self",
                "VKSHMEM_UCX_TRUSTED_NETWORK": "1"},
    "ofi-tcp": {"VKSHMEM_SHM": "0", "VKSHMEM_TRANSPORTS": "ofi",
                "VKSHMEM_OFI_PROVIDER": "tcp;ofi_rxm"},
}
WORDS = 4096  # a mailbox row: 32 KiB
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def worker(minutes: float, seed: int) -> None:
    """One PE's part (run under ``vkshmem run``)."""
    import numpy as np

    from vkshmem import shmem

    me, n = shmem.my_pe(), shmem.n_pes()
    box = shmem.zeros((n, WORDS), np.int64)  # box[i] on PE j: what PE i put to PE j
    ctr = shmem.zeros(n, np.int64)  # counters this PE's peers add to
    word = shmem.zeros(1, np.int64)  # on PE 0: incremented under the lock
    lock = shmem.new_lock()
    sig = shmem.zeros(1, np.uint64)
    sbuf = shmem.zeros(256, np.int64)
    red_src, red_dst = shmem.zeros(64, np.int64), shmem.zeros(64, np.int64)
    bc_src, bc = shmem.zeros(128, np.int64), shmem.zeros(128, np.int64)
    fc_src, fc_dst = shmem.zeros(8, np.int64), shmem.zeros(8 * n, np.int64)
    go_src, go = shmem.zeros(1, np.int64), shmem.zeros(1, np.int64)
    rng = np.random.default_rng(seed * 1000 + me)
    ops: dict[str, int] = {k: 0 for k in ("put", "get", "amo", "lock", "signal", "collective")}
    errs = {"lost": 0, "torn": 0, "wrong": 0}
    locked_total = 0
    sent = np.zeros(n, np.int64)  # AMO increments this PE sent to each PE, so far
    amo_lost = 0  # lost AMO increments of this PE's counters found so far
    start = time.monotonic()
    deadline, warm_at = start + 60 * minutes, start + 6 * minutes
    rss: list[tuple[float, int]] = [(0.0, _rss())]
    warm_rss: int | None = None
    next_sample = start + 2
    idx = np.arange(WORDS, dtype=np.int64)

    def pattern(src: int, dst: int, rnd: int, k: np.ndarray) -> np.ndarray:
        return (rnd << 32) | (src << 24) | (dst << 16) | (k & 0xFFFF)

    def check_row(row: np.ndarray, src: int, dst: int, rnd: int, length: int) -> None:
        if length == 0:
            return
        want = pattern(src, dst, rnd, idx[:length])
        bad = row[:length] != want
        if bad.all():
            errs["lost"] += 1
        elif bad.any():
            errs["torn"] += 1

    rnd = 0
    while True:
        rnd += 1
        shared = np.random.default_rng(seed * 7919 + rnd)  # the same draws on every PE
        lengths = shared.integers(0, WORDS + 1, size=(n, n))  # [src, dst]
        # A. puts
        for dst in rng.permutation(n):
            length = int(lengths[me, dst])
            if length:
                data = pattern(me, int(dst), rnd, idx[:length])
                if rng.random() < 0.5:
                    shmem.put(box[me], data, int(dst), size=length)
                else:
                    shmem.put_nbi(box[me], data, int(dst), size=length)
                ops["put"] += 1
        shmem.quiet()
        shmem.barrier_all()
        # B. checks, gets, AMOs, locks, signals
        for src in range(n):
            check_row(box[src], src, me, rnd, int(lengths[src, me]))
        got = np.empty(WORDS, np.int64)
        for _ in range(4):
            pe, src = int(rng.integers(n)), int(rng.integers(n))
            length = int(lengths[src, pe])
            if length:
                shmem.get(got, box[src], pe, size=length)
                check_row(got, src, pe, rnd, length)
                ops["get"] += 1
        for _ in range(int(rng.integers(8, 33))):
            pe, kind = int(rng.integers(n)), int(rng.integers(4))
            if kind == 0:
                shmem.atomic_fetch_add(ctr[me:me + 1], 1, pe)
            elif kind == 1:
                shmem.atomic_add(ctr[me:me + 1], 1, pe)
            elif kind == 2:
                shmem.atomic_inc(ctr[me:me + 1], pe)
            else:
                old = shmem.atomic_fetch(ctr[me:me + 1], pe)
                while (seen := shmem.atomic_compare_swap(ctr[me:me + 1], old, old + 1,
                                                         pe)) != old:
                    old = seen
            sent[pe] += 1
            ops["amo"] += 1
        for _ in range(int(rng.integers(1, 4))):
            shmem.set_lock(lock)
            v = np.empty(1, np.int64)
            shmem.get(v, word, 0)
            shmem.put(word, v + 1, 0)
            shmem.quiet()
            shmem.clear_lock(lock)
            locked_total += 1
            ops["lock"] += 1
        nxt = (me + 1) % n
        block = pattern(me, nxt, rnd, idx[:256])
        shmem.put_signal(sbuf, block, nxt, sig, rnd, shmem.SIGNAL_SET)
        shmem.signal_wait_until(sig, shmem.CMP.GE, rnd)
        prev = (me - 1) % n
        check_row(sbuf, prev, me, rnd, 256)
        ops["signal"] += 1
        shmem.barrier_all()  # every AMO and lock increment of the round is done
        # C. collectives and their checks
        red_src[:n] = sent
        red_src[n] = locked_total
        shmem.sum_reduce(red_dst, red_src, size=n + 1)
        diff = abs(int(red_dst[me]) - int(ctr.sum()))  # increments sent here vs arrived
        if diff > amo_lost:
            errs["lost"] += diff - amo_lost
            amo_lost = diff
        if me == 0 and int(word[0]) != int(red_dst[n]):
            errs["lost"] += abs(int(red_dst[n]) - int(word[0]))
            word[0] = red_dst[n]  # count each lost increment once
        vec = shared.integers(-1000, 1000, size=(n, 64))
        red_src[:] = vec[me]
        shmem.sum_reduce(red_dst, red_src)
        errs["wrong"] += int((red_dst != vec.sum(axis=0)).any())
        root = int(shared.integers(n))
        bc_src[:] = pattern(root, 0, rnd, idx[:128]) if me == root else -1
        shmem.broadcast(bc, bc_src, root)  # (bc holds the last round's: a miss shows)
        errs["wrong"] += int((bc != pattern(root, 0, rnd, idx[:128])).any())
        fc_src[:] = pattern(me, 1, rnd, idx[:8])
        shmem.fcollect(fc_dst, fc_src)
        want = np.concatenate([pattern(p, 1, rnd, idx[:8]) for p in range(n)])
        errs["wrong"] += int((fc_dst != want).any())
        ops["collective"] += 4
        now = time.monotonic()
        if now >= next_sample:
            rss.append((now - start, _rss()))
            next_sample = now + 2
        if warm_rss is None and now >= warm_at:
            warm_rss = _rss()
        go_src[0] = int(now < deadline) if me == 0 else 0
        shmem.broadcast(go, go_src, 0)
        if not go[0]:
            break
    end_rss = _rss()
    print("SOAK " + json.dumps({
        "pe": me, "rounds": rnd, "seconds": round(time.monotonic() - start, 1), "ops": ops,
        "errors": errs, "rss_start": rss[0][1], "rss_warm": warm_rss or rss[0][1],
        "rss_end": end_rss, "rss_max": max(r for _, r in [*rss, (0, end_rss)]),
        "samples": len(rss)}), flush=True)
    shmem.free(box)


def drive(args: argparse.Namespace) -> int:
    """Run the soak per transport and print the report."""
    here = Path(__file__).resolve()
    report: dict[str, object] = {}
    status = 0
    for mode in args.transports.split(","):
        env = {**os.environ, **MODES[mode], "VKSHMEM_SYMMETRIC_SIZE": "64M",
               "VKSHMEM_WAIT_TIMEOUT": "120"}
        limit = 60 * args.minutes + 180
        cmd = [sys.executable, "-m", "vkshmem", "run", "-n", str(args.npes), "--timeout",
               str(int(limit)), str(here), "--worker", "--minutes", str(args.minutes),
               "--seed", str(args.seed)]
        t0 = time.monotonic()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit + 30)
        pes = [json.loads(line.split("SOAK ", 1)[1]) for line in r.stdout.splitlines()
               if "SOAK {" in line]
        if r.returncode != 0 or len(pes) != args.npes:
            status = 1
            print(f"{mode}: FAILED (exit {r.returncode})\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            report[mode] = {"failed": r.returncode}
            continue
        ops = {k: sum(p["ops"][k] for p in pes) for k in pes[0]["ops"]}
        errs = {k: sum(p["errors"][k] for p in pes) for k in pes[0]["errors"]}
        growth = [p["rss_end"] - p["rss_warm"] for p in pes]
        total = sum(ops.values())
        secs = time.monotonic() - t0
        report[mode] = {"rounds": pes[0]["rounds"], "seconds": round(secs, 1), "ops": ops,
                        "ops_total": total, "errors": errs, "pes": pes}
        mib = 1 << 20
        print(f"{mode}: {pes[0]['rounds']} rounds, {total} operations in {secs:.0f} s "
              f"({total / max(secs, 1e-9):.0f}/s): " + ", ".join(f"{k} {v}" for k, v in
                                                               ops.items()))
        print('  errors: ' + ', '.join(f'{k} {v}' for k, v in errs.items()))
        print("  RSS per PE, MiB (after warm-up -> end, growth): " + "; ".join(
            f"{p['rss_warm'] / mib:.1f} -> {p['rss_end'] / mib:.1f} ({g / mib:+.2f})"
            for p, g in zip(pes, growth, strict=True)))
        if any(errs.values()):
            status = 1
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="duration per transport")
    p.add_argument("--npes", type=int, default=4)
    p.add_argument("--transports", default="shm,hostproxy,ucx",
                   help=f"comma-separated, of: {', '.join(MODES)}")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the report here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.minutes, args.seed)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())

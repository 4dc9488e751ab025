"""The driver of ``vkshmem bench``: runs vkshmem's side and then each reference, one after
the other, with one progress bar over all of them, and writes the outputs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .perftest import TESTS, find_perftest, run_perftest
from .report import Report
from .sides import (
    BenchError,
    Outcome,
    Skipped,
    mpi4py_command,
    run_side,
    shmem4py_command,
    shmem4py_env,
    vkshmem_command,
    write_plan,
)
from .spec import Plan, format_size

__all__ = ["run"]

Tick = Callable[[str, int], None]


class _Bar:
    """A tqdm progress bar on stderr (nothing when it is off or tqdm is missing)."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        self.bar: Any = None
        if enabled is False:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # a dependency, but the bench works without it
            return
        # disable=None: on only when stderr is a terminal, unless --progress asked for it
        self.bar = tqdm(total=total, file=sys.stderr, unit="test", leave=False,
                        dynamic_ncols=True, disable=None if enabled is None else False)

    def tick_for(self, side: str) -> Tick:
        def tick(bench: str, size: int) -> None:
            if self.bar is not None:
                self.bar.set_description(side, refresh=False)
                self.bar.set_postfix_str(f"{bench} {format_size(size)}", refresh=False)
                self.bar.update(1)
        return tick

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _references(args: argparse.Namespace, plan: Plan, plan_path: str,
                ) -> tuple[list[tuple[str, Callable[[Tick], Outcome], int]], list[Outcome]]:
    """The references to run (name, runner, number of results) and those skipped; raises
    :class:`Skipped` for a missing one that was named explicitly."""
    wanted = args.compare.names if args.compare else []
    explicit = bool(args.compare and args.compare.explicit)
    todo: list[tuple[str, Callable[[Tick], Outcome], int]] = []
    skipped: list[Outcome] = []
    n, t = len(plan.items), args.timeout
    for name in wanted:
        try:
            if name == "mpi4py":
                cmd = mpi4py_command(args.npes, plan_path, plan.bind)
                todo.append((name, lambda tick, c=cmd, nm=name: run_side(
                    nm, c, dict(os.environ), t, tick), n))
            elif name == "shmem4py":
                cmd = shmem4py_command(args.npes, plan_path, plan.bind)
                todo.append((name, lambda tick, c=cmd, nm=name: run_side(
                    nm, c, shmem4py_env(dict(os.environ)), t, tick), n))
            else:
                if args.npes != 2:
                    raise Skipped(f"ucx_perftest runs 2 processes, not {args.npes}")
                find_perftest()
                count = sum(1 for i in plan.items if i.bench in TESTS)
                if count == 0:
                    raise Skipped("it has no test for the benchmarks chosen")
                todo.append((name, lambda tick: run_perftest(plan, args.npes, t, tick),
                             count))
        except Skipped as exc:
            if explicit:
                raise Skipped(f"--compare {name}: {exc}") from None
            skipped.append(Outcome(name, skipped=str(exc)))
    return todo, skipped


def _merge(into: Outcome, more: Outcome) -> None:
    """Pool the samples of another round of the same side."""
    into.meta = into.meta or more.meta
    for key, samples in more.results.items():
        into.results.setdefault(key, []).extend(samples)


def _write(dest: str, text: str, what: str) -> None:
    if dest == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        Path(dest).write_text(text if text.endswith("\n") else text + "\n")
        print(f"vkshmem bench: wrote {what} to {dest}", file=sys.stderr)


def run(args: argparse.Namespace, plan: Plan, meta: dict[str, Any], env: dict[str, str],
        tmp: str, parser: argparse.ArgumentParser) -> int:
    """Measure every side and write the outputs; returns the exit status (1 when a side
    failed: the others are still reported)."""
    plan_path = write_plan(plan, tmp)
    try:
        todo, skipped = _references(args, plan, plan_path)
    except Skipped as exc:
        parser.error(str(exc))
    rounds = args.rounds
    bar = _Bar(rounds * (len(plan.items) + sum(count for _, _, count in todo)), args.progress)
    status = 0
    main = Outcome("vkshmem")
    done: dict[str, Outcome] = {}
    try:
        for _ in range(rounds):  # the sides take turns: a load spike hits each side alike
            try:
                _merge(main, run_side("vkshmem", vkshmem_command(args.npes, plan_path,
                                                                  args.timeout),
                                      env, args.timeout + 30, bar.tick_for("vkshmem")))
            except BenchError as exc:
                bar.close()
                print(f"vkshmem bench: error: {exc}", file=sys.stderr)
                return 1
            for name, runner, _count in todo:
                if any(o.name == name for o in skipped):
                    continue  # failed in an earlier round
                try:
                    _merge(done.setdefault(name, Outcome(name)), runner(bar.tick_for(name)))
                except BenchError as exc:
                    status = 1
                    print(f"vkshmem bench: {exc}", file=sys.stderr)
                    done.pop(name, None)
                    skipped.append(Outcome(name,
                                           skipped=f"failed: {str(exc).splitlines()[0]}"))
    finally:
        bar.close()
    refs = [done[name] for name, _, _ in todo if name in done]
    meta["load_end"] = f"{os.getloadavg()[0]:.1f}"
    report = Report(plan, main, refs, skipped, meta)
    if args.csv:
        _write(args.csv, report.csv(), "CSV")
    if args.json:
        _write(args.json, report.json(), "JSON")
    if "-" not in (args.csv, args.json):
        sys.stdout.write(report.table(markdown=args.markdown))
    if args.plot:
        report.plot(args.plot)
        print(f"vkshmem bench: wrote the plot to {args.plot}", file=sys.stderr)
    sys.stdout.flush()
    return status

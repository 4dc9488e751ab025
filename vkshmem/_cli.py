"""The ``vkshmem`` command (also ``python -m vkshmem``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

_DESCRIPTION = """\
vkshmem: vendor-neutral OpenSHMEM-style distributed shared memory for CPUs and GPUs.

examples:
  vkshmem run -n 4 script.py          start 4 PEs of script.py on this host (like oshrun)
  vkshmem run -n 2 -m mypackage.bench --iters 100
  vkshmem info                        show the VKSHMEM_* variables, plugins and choices
  vkshmem doctor                      try every transport and memory domain here at 2 PEs
  vkshmem bench --compare             OSU-style benchmarks, next to mpi4py RMA (and more)

Multi-host jobs run under mpirun/srun/torchrun (bootstraps 'mpi' and 'env').

Run 'vkshmem <command> --help' for a command's options.
"""

_RUN_DESCRIPTION = """\
Start N processing elements (PEs) of a Python program on this host and watch them.

Each PE is 'python SCRIPT ARGS...' (or 'python -m MODULE ARGS...') with the same interpreter
as vkshmem itself. Output is forwarded line by line, prefixed with '[pe i] '. When one PE
fails (non-zero exit, killed by a signal, an uncaught exception reported by the runtime), the
others get 1 s to end on their own (their blocking calls raise PeerFailedError naming it),
then SIGTERM, and SIGKILL after --grace seconds (after global_exit: SIGTERM at once), and the
launcher says which PE failed and why. Ctrl-C ends every PE. The PEs' stdin is /dev/null.
"""

_RUN_EPILOG = """\
examples:
  vkshmem run -n 4 script.py --size 1M        run script.py on 4 PEs
  vkshmem run -n 2 -- script.py -n 10         '--' ends vkshmem's options
  vkshmem run -n 2 -m mypackage.bench --iters 100
  vkshmem run -n 8 --timeout 300 train.py     end the job (exit 124) after 5 minutes
  vkshmem run -n 4 --no-prefix script.py > out.txt

set in each PE's environment:
  VKSHMEM_LAUNCHER   host:port of the launcher's bootstrap store
  VKSHMEM_PE         the PE's rank, 0 .. N-1
  VKSHMEM_NPES       N
  VKSHMEM_JOB_ID     an id unique to this job
  PYTHONUNBUFFERED   1 (output appears as it is printed)

read by the PEs (see 'vkshmem info' for all VKSHMEM_* variables):
  VKSHMEM_BOOTSTRAP          auto (default) picks 'local' under this launcher
  VKSHMEM_BOOTSTRAP_TIMEOUT  seconds a PE waits for the others at start-up (default 60)

exit status:
  0 when every PE exits 0; otherwise that of the first failure: the PE's exit code,
  128+S for a PE killed by signal S, the status given to global_exit, 124 after --timeout,
  130 after Ctrl-C (128+S for another signal to the launcher).

This launcher starts PEs on one host. For several hosts, use your site's launcher:
mpirun/mpiexec (bootstrap 'mpi', needs mpi4py), srun or torchrun (bootstrap 'env').
"""

#: ``run`` options that take a separate value (used to find where the program starts).
_RUN_VALUE_OPTIONS = {"-n", "--npes", "--timeout", "--grace"}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``vkshmem`` command."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="vkshmem", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"vkshmem {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="command")

    run = sub.add_parser(
        "run", help="start N PEs of a program on this host",
        description=_RUN_DESCRIPTION, epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="vkshmem run -n N [options] [--] SCRIPT [ARGS ...]\n"
              "       vkshmem run -n N [options] -m MODULE [ARGS ...]")
    run.add_argument("-n", "--npes", type=_positive_int, required=True, metavar="N",
                     help="number of PEs to start (at least 1)")
    run.add_argument("-m", "--module", metavar="MODULE",
                     help="run a module as 'python -m MODULE' instead of a script; what "
                          "follows is the module's arguments")
    run.add_argument("--timeout", type=_positive_seconds, metavar="SECONDS",
                     help="end the whole job after SECONDS and exit with status 124")
    run.add_argument("--grace", type=_seconds, default=3.0, metavar="SECONDS",
                     help="seconds between SIGTERM and SIGKILL when ending PEs "
                          "(default: %(default)s)")
    run.add_argument("--no-prefix", dest="prefix", action="store_false",
                     help="do not prefix each output line with '[pe i] '")
    run.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS ...]",
                     help="the Python script to run on every PE, and its arguments")
    run.set_defaults(func=_cmd_run, command_parser=run)

    info = sub.add_parser(
        "info", help="show the configuration, the plugins and what was chosen",
        description="Show every VKSHMEM_* variable with its value, the installed plugins "
                    "(bootstraps, transports) and what vkshmem chooses here.")
    info.add_argument("-n", "--npes", type=_positive_int, default=1, metavar="N",
                      help="number of PEs to probe with (default: %(default)s)")
    info.set_defaults(func=_cmd_info, command_parser=info)

    doctor = sub.add_parser(
        "doctor", help="self-test this machine: every transport and domain at 2 PEs",
        description="Try what vkshmem can use on this machine, loop-backed at 2 PEs: the shm "
                    "path, each installed transport carrying all traffic, each memory domain "
                    "(GPU export/import), the Vulkan validation layer, and the env and mpi "
                    "bootstraps. Prints what works, what does not, and the variable or package "
                    "that would change it. Exit status 1 when a check that ran failed or a "
                    "check named here could not run.",
        epilog="examples:\n  vkshmem doctor\n  vkshmem doctor ucx ofi --json\n"
               "  vkshmem doctor vulkan validation --timeout 120",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    doctor.add_argument("checks", nargs="*", metavar="CHECK",
                        help="run only these checks (shm, a transport or domain name, "
                             "vulkan-import, validation, env, mpi); each must then work")
    doctor.add_argument("--json", action="store_true", help="print the results as JSON")
    doctor.add_argument("--timeout", type=_positive_seconds, default=60.0, metavar="SECONDS",
                        help="limit of each check (default: %(default)s)")
    doctor.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr")
    doctor.set_defaults(func=_cmd_doctor, command_parser=doctor)

    from ._bench.cli import add_parser as add_bench  # options only; runs nothing

    add_bench(sub)
    return parser


def _rest(args: list[str]) -> list[str]:
    """The module's arguments, behind one '--' (a '--' the user put there is dropped)."""
    return ["--", *(args[1:] if args[:1] == ["--"] else args)]


def _split_module(argv: list[str]) -> list[str]:
    """Make ``run ... -m MODULE ARGS`` parse: everything after MODULE belongs to it."""
    if not argv or argv[0] != "run":
        return argv
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--" or not tok.startswith("-") or tok == "-":
            break
        if tok in ("-m", "--module"):
            if i + 1 < len(argv):
                return [*argv[:i], "--module", argv[i + 1], *_rest(argv[i + 2:])]
            break
        if tok.startswith("--module="):
            return [*argv[:i], tok, *_rest(argv[i + 1:])]
        if tok.startswith("-m") and not tok.startswith("--"):
            return [*argv[:i], "--module", tok[2:], *_rest(argv[i + 1:])]
        i += 2 if tok in _RUN_VALUE_OPTIONS else 1
    return argv


def _cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ._launcher import LaunchOptions, run_job

    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if args.module is not None:
        if not args.module:
            parser.error("run: -m needs a module name")
        command = ["-m", args.module, *program]
    else:
        if not program:
            parser.error("run: nothing to run; give a script (vkshmem run -n 2 script.py) or "
                         "a module (vkshmem run -n 2 -m package.module)")
        script = program[0]
        if not os.path.exists(script):
            parser.error(f"run: script {script!r} not found (relative to {os.getcwd()})")
        if os.path.isdir(script) and not os.path.exists(os.path.join(script, "__main__.py")):
            parser.error(f"run: {script!r} is a directory without __main__.py")
        command = program
    return run_job(LaunchOptions(npes=args.npes, command=command, prefix=args.prefix,
                                 timeout=args.timeout, grace=args.grace))


def _cmd_info(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import _info  # imported lazily: it may load plugins and devices

    return int(_info.main(args) or 0)


def _cmd_doctor(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import _doctor  # imported lazily: it loads plugins

    return _doctor.main(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vkshmem`` console script; returns the exit status."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(_split_module(words))
    args.argv = words  # 'vkshmem bench' prints the command it ran
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args, args.command_parser))

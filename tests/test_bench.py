"""``vkshmem bench``: options, the plan, the outputs (table, CSV, JSON, Markdown, plot), and
small real runs of vkshmem alone, next to mpi4py and ucx_perftest, and through the shmem4py
path (a stand-in oshrun and shmem4py that run vkshmem itself). Real runs use tiny iteration
counts; every subprocess has a timeout."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vkshmem import _cli
from vkshmem._bench import cli as bench_cli
from vkshmem._bench.report import Report
from vkshmem._bench.sides import Outcome
from vkshmem._bench.spec import (
    BENCHES,
    GROUPS,
    Plan,
    make_plan,
    parse_benches,
    parse_size,
    parse_sizes,
    stats,
)

SUB_TIMEOUT = 180
TINY = ["-i", "5", "-w", "1", "--samples", "2", "--timeout", "120"]
HAS_MPI4PY = importlib.util.find_spec("mpi4py") is not None
HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def bench(*args: str, env: dict[str, str] | None = None,
          cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "VKSHMEM_SYMMETRIC_SIZE": "64M", "VKSHMEM_WAIT_TIMEOUT": "60",
            **(env or {})}
    return subprocess.run([sys.executable, "-m", "vkshmem", "bench", *args], env=full,
                          capture_output=True, text=True, timeout=SUB_TIMEOUT, cwd=cwd)


# -- the plan ---------------------------------------------------------------------------------

def test_sizes_and_benchmarks_parse() -> None:
    assert parse_size("8") == 8 and parse_size("4K") == 4096 and parse_size("2MiB") == 2 << 20
    assert parse_sizes("8:64,1M,8") == [8, 16, 32, 64, 1 << 20]
    assert parse_benches("amo") == list(GROUPS["amo"])
    assert parse_benches("barrier,put_lat") == ["put_lat", "barrier"]  # table order
    assert set(parse_benches("all")) == set(BENCHES)
    for bad, msg in (("0", "between 1 byte"), ("x", "not a size"), ("2G", "between"),
                     ("64:8", "goes down"), ("8,,16", "empty size")):
        with pytest.raises(ValueError, match=msg):
            parse_sizes(bad)


def test_plan_scales_large_messages_and_limits_rates() -> None:
    plan = make_plan(["put_lat", "put_rate", "fetch_add", "reduce"], [3, 8, 1 << 20],
                     1000, 100, 5, 64)
    items = {(i.bench, i.size): i for i in plan.items}
    assert items[("put_lat", 8)].iters == 1000
    assert items[("put_lat", 1 << 20)].iters == 1000 * 64 // 1024
    assert items[("put_lat", 1 << 20)].warmup == 10  # 100 * 64 // 1024, but at least 10
    assert ("put_rate", 1 << 20) not in items and ("put_rate", 8) in items
    assert [i.size for i in plan.items if i.bench == "fetch_add"] == [8]
    assert [i.size for i in plan.items if i.bench == "reduce"] == [8, 1 << 20]  # float64
    assert Plan.from_json(plan.to_json()) == plan


def test_stats_units() -> None:
    assert stats("lat", 8, [1e-6, 3e-6, 2e-6]) == pytest.approx((2.0, 1.0, 3.0))
    assert stats("bw", 1000, [1e-6, 2e-6, 4e-6]) == pytest.approx((0.5, 0.25, 1.0))
    assert stats("rate", 8, [1e-6]) == pytest.approx((1.0, 1.0, 1.0))


# -- outputs, from made-up results -------------------------------------------------------------

def _report() -> Report:
    plan = make_plan(["put_lat", "put_bw", "barrier"], [8, 4096], 10, 1, 2, 4)
    main = Outcome("vkshmem", {"label": "vkshmem 0.1.0", "library": "routes: shm"})
    ref = Outcome("mpi4py", {"label": "mpi4py 4", "library": "Open MPI"})
    for item in plan.items:
        main.results[(item.bench, item.size)] = [2e-6, 2e-6]
        ref.results[(item.bench, item.size)] = [1e-6, 1e-6]
    del ref.results[("barrier", 0)]
    meta = {"date": "2026-01-01 00:00 UTC", "host": "host h", "npes": 2, "domain": "host",
            "command": "vkshmem bench"}
    return Report(plan, main, [ref], [Outcome("shmem4py", skipped="oshrun not found")], meta)


def test_table_csv_json_markdown() -> None:
    rep = _report()
    table = rep.table()
    assert "vkshmem/mpi4py" in table and "shmem4py     skipped: oshrun not found" in table
    line = next(x for x in table.splitlines() if x.startswith("put_lat") and "8 B" in x)
    assert line.split()[-3:] == ["2.00", "1.00", "2.00"]  # us, us, ratio
    bw = next(x for x in table.splitlines() if x.startswith("put_bw") and "4 KiB" in x)
    assert bw.split()[-1] == "2.00"  # a time ratio for GB/s too: vkshmem is 2x slower
    barrier = next(x for x in table.splitlines() if x.startswith("barrier"))
    assert barrier.split()[-2:] == ["-", "-"]  # no reference figure: no ratio
    rows = list(csv.DictReader(io.StringIO(rep.csv())))
    assert rows[0] == {"benchmark": "put_lat", "size_bytes": "8", "unit": "us",
                       "vkshmem": "2", "mpi4py": "1", "ratio_mpi4py": "2"}
    assert rows[-1]["ratio_mpi4py"] == "" and rows[-1]["mpi4py"] == ""
    doc = json.loads(rep.json())
    assert doc["sides"]["shmem4py"] == {"skipped": "oshrun not found"}
    first = doc["rows"][0]
    assert first["values"]["vkshmem"]["samples_s_per_op"] == [2e-6, 2e-6]
    assert first["ratios"] == {"mpi4py": pytest.approx(2.0)}
    md = rep.table(markdown=True)
    assert md.startswith("```text\nvkshmem bench: 2 PEs, host memory, 2026-01-01 00:00 UTC")
    assert "| benchmark | size | unit | vkshmem | mpi4py | vkshmem/mpi4py |" in md
    assert "| put_lat | 8 B | us | 2.00 | 1.00 | 2.00 |" in md


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed (vkshmem[plot])")
def test_plot_file(tmp_path: Path) -> None:
    out = tmp_path / "p.png"
    _report().plot(str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the command line ---------------------------------------------------------------------------

def test_help_explains_the_options() -> None:
    r = bench("--help")
    assert r.returncode == 0
    for needle in ("--npes", "--bench", "--sizes", "--iters", "--warmup", "--samples", "--rounds",
                   "--window", "--transport", "--rail", "--domain", "--compare", "--csv",
                   "--json", "--markdown", "--plot", "--progress", "--timeout", "ucx_perftest",
                   "shmem4py", "oshrun", "OMPI_MCA_btl=^openib", "mpiexec", "put_signal",
                   "alltoall", "vkshmem/REF", "examples:", "powers of two"):
        assert needle in r.stdout, needle
    top = subprocess.run([sys.executable, "-m", "vkshmem", "--help"], capture_output=True,
                         text=True, timeout=SUB_TIMEOUT)
    assert "bench" in top.stdout


def test_list_describes_benchmarks_and_references() -> None:
    r = bench("--list")
    assert r.returncode == 0
    assert all(name in r.stdout for name in BENCHES)
    assert "mpi4py" in r.stdout and "ucx_perftest" in r.stdout and "shmem4py" in r.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["-s", "0"], "size '0' must be between 1 byte and 1G"),
    (["-s", "8,abc"], "'abc' is not a size"),
    (["-b", "nosuch"], "unknown benchmark 'nosuch'"),
    (["--compare", "nosuch"], "unknown reference 'nosuch'"),
    (["-i", "0"], "must be at least 1"),
    (["-n", "two"], "not a whole number"),
    (["--timeout", "0"], "more than 0"),
    (["--domain", "tpu"], "invalid choice"),
    (["--csv", "--json"], "cannot both go to stdout"),
    (["--json", "/no/such/dir/x.json"], "does not exist"),
    (["-b", "put_rate", "-s", "1M"], "nothing to measure"),
    (["--transport", "shm", "--rail", "hostproxy"], "which no rail carries"),
])
def test_bad_options(args: list[str], message: str) -> None:
    r = bench(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr


def test_plot_without_matplotlib_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        _cli.main(["bench", "--plot", "x.png"])
    assert exc.value.code == 2


def test_a_missing_reference_named_explicitly_is_an_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no oshrun
    r = bench("--compare", "shmem4py", "-b", "barrier", *TINY)
    assert r.returncode == 2
    assert "--compare shmem4py: oshrun not found" in r.stderr and "openmpi-bin" in r.stderr


# -- real runs ------------------------------------------------------------------------------------

def test_vkshmem_alone_json_on_stdout() -> None:
    r = bench("-b", "put_lat,get_bw,fetch_add,compare_swap,put_signal,barrier,reduce",
              "-s", "8,4096", *TINY, "--rounds", "2", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["meta"]["rounds"] == 2
    assert doc["sides"]["vkshmem"]["routes"] == "shm"
    assert len(doc["rows"]) == 2 + 2 + 1 + 1 + 2 + 1 + 2
    for row in doc["rows"]:
        v = row["values"]["vkshmem"]
        assert len(v["samples_s_per_op"]) == 4 and v["median"] > 0, row  # 2 x 2 rounds


@pytest.mark.skipif(not HAS_MPI4PY, reason="mpi4py is not installed (vkshmem[mpi])")
def test_compare_with_mpi4py(tmp_path: Path) -> None:
    benches = "put_lat,get_lat,put_bw,put_rate,fetch,set,swap,compare_swap,fetch_add,xor," \
              "put_signal,barrier,broadcast,reduce,fcollect,alltoall"
    r = bench("-b", benches, "-s", "8,4096", *TINY, "--compare", "mpi4py", "--csv", "out.csv",
              "--json", "out.json", *(["--plot", "out.png"] if HAS_MPL else []), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vkshmem/mpi4py" in r.stdout and "mpi4py 4" in r.stdout, r.stdout
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert {row["benchmark"] for row in rows} == set(benches.split(","))
    for row in rows:
        assert float(row["vkshmem"]) > 0 and float(row["mpi4py"]) > 0, row
        assert float(row["ratio_mpi4py"]) > 0, row
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["sides"]["mpi4py"]["library"].startswith("Open MPI"), doc["sides"]
    if HAS_MPL:
        assert (tmp_path / "out.png").stat().st_size > 1000


def test_compare_with_ucx_perftest() -> None:
    from vkshmem._bench.perftest import find_perftest
    from vkshmem._bench.sides import Skipped

    try:
        find_perftest()
    except Skipped as exc:
        pytest.skip(str(exc))
    r = bench("-b", "put_lat,get_lat,put_bw,fetch_add,fetch", "-s", "8", *TINY,
              "--compare", "ucx_perftest", "--csv")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["benchmark"]: row for row in csv.DictReader(io.StringIO(r.stdout))}
    assert float(rows["fetch_add"]["ucx_perftest"]) > 0, rows
    assert rows["fetch"]["ucx_perftest"] == ""  # perftest has no plain fetch


def test_compare_all_lists_what_is_missing(tmp_path: Path) -> None:
    env = {"PATH": f"{Path(sys.executable).parent}:{tmp_path}"}  # no oshrun here
    r = bench("-b", "barrier", *TINY, "--compare", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shmem4py     skipped: oshrun not found" in r.stdout, r.stdout


def test_transport_and_rail_options() -> None:
    r = bench("-b", "put_lat", "-s", "8", *TINY, "--transport", "hostproxy", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["sides"]["vkshmem"]["routes"] == "hostproxy"
    r = bench("-b", "fetch", *TINY, "--rail", "hostproxy", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["sides"]["vkshmem"]["routes"] == "hostproxy"
    bad = bench("-b", "fetch", *TINY, "--transport", "nosuch")
    assert bad.returncode == 1
    assert "vkshmem side failed" in bad.stderr and "nosuch" in bad.stderr, bad.stderr


def test_a_side_past_its_timeout_is_ended() -> None:
    r = bench("-b", "barrier", "--timeout", "0.3")
    assert r.returncode == 1
    assert "ran past --timeout" in r.stderr, r.stderr


FAKE_OSHRUN = """\
#!{python}
# A stand-in for Open MPI's oshrun: runs the program under 'vkshmem run' instead.
import os, sys
args = sys.argv[1:]
n = args[args.index("-n") + 1]
assert os.environ["OMPI_MCA_btl"] == "^openib"
prog = args[args.index("-m"):]  # -m vkshmem._bench.kernels PLAN --impl shmem4py
os.execv(sys.executable, [sys.executable, "-m", "vkshmem", "run", "-n", n, "--no-prefix",
                          *prog])
"""


def test_shmem4py_path_with_a_stand_in(tmp_path: Path) -> None:
    """Detection, the oshrun command and the kernels' use of only shmem4py's names, with a
    'shmem4py' that is vkshmem under that name (no OSHMEM here)."""
    oshrun = tmp_path / "oshrun"
    oshrun.write_text(FAKE_OSHRUN.format(python=sys.executable))
    oshrun.chmod(oshrun.stat().st_mode | stat.S_IXUSR)
    pkg = tmp_path / "shmem4py"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "0+stand-in"\n')
    (pkg / "shmem.py").write_text(textwrap.dedent("""\
        from vkshmem.shmem import *  # noqa: F403
        from vkshmem.shmem import info_get_name, info_get_version  # noqa: F401
        """))
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path)}
    r = bench("-b", "put_lat,fetch_add,put_signal,alltoall", "-s", "8", *TINY,
              "--compare", "shmem4py", "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["sides"]["shmem4py"]["label"] == "shmem4py 0+stand-in"
    assert all(row["values"]["shmem4py"]["median"] > 0 for row in doc["rows"]), doc["rows"]


def test_parser_is_registered() -> None:
    parser = _cli.build_parser()
    args = parser.parse_args(["bench", "--compare", "-s", "8"])
    assert args.func is bench_cli.cmd_bench
    assert args.compare == bench_cli.Compare(["mpi4py", "shmem4py", "ucx_perftest"], False)
    args = parser.parse_args(["bench", "--compare", "mpi,perftest"])
    assert args.compare == bench_cli.Compare(["mpi4py", "ucx_perftest"], True)

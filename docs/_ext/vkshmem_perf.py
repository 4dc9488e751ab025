"""The performance page of the documentation: tables and bandwidth plots generated from
``benchmarks/results/*.json`` (the files each benchmark writes), each with its run's settings,
the reference measured in the same run, and the command (used by :mod:`vkshmem_docs`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vkshmem_md import md as _md

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "_generated"


_META = (("date", "Date"), ("device", "Device"), ("driver", "Driver"), ("machine", "Machine"),
         ("domain", "Domain"), ("header", "What"), ("setting", "Setting"),
         ("rounds", "Rounds"), ("cuda", "Reference (CUDA column)"), ("ratio", "Ratio"),
         ("note", "Note"))
_REFS = ("cuda", "nvshmem", "ceiling", "transport", "nccl", "floor_us", "ceiling_us")


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return _size(v) if v >= 1024 else str(v)
    return _md(str(v))


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return str(n)


def _ratio(row: dict[str, Any], ref: str) -> str:
    """vkshmem against ``ref``, above 1 where vkshmem is better (faster, or more GB/s)."""
    mine, theirs = row.get("vkshmem"), row.get(ref)
    if not isinstance(mine, (int, float)) or not isinstance(theirs, (int, float)):
        return "-"
    if not mine or not theirs:
        return "-"
    unit = str(row.get("unit", ""))
    r = mine / theirs if "/s" in unit else theirs / mine
    return f"{r:.2f}"


def _plot(path: Path, rows: list[dict[str, Any]]) -> str | None:
    """A bandwidth plot of ``rows`` (GB/s against size, vkshmem solid, its reference dashed)
    written next to the generated pages; its file name, or None when there is nothing to plot
    or matplotlib is missing (the docs extra installs it)."""
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("unit") == "GB/s" and isinstance(r.get("bytes"), int) and r.get("vkshmem"):
            key = f"{r.get('op')} {r.get('pair') or r.get('domain') or ''}".strip()
            series.setdefault(key, []).append(r)
    series = {k: v for k, v in series.items() if len(v) >= 3}
    if not series:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    for i, (key, rs) in enumerate(sorted(series.items())):
        color = f"C{i % 10}"
        xs = [r["bytes"] for r in rs]
        ax.plot(xs, [r["vkshmem"] for r in rs], "o-", color=color, label=f"{key}: vkshmem")
        for ref, style in (("cuda", "--"), ("ceiling", "--"), ("transport", "--"),
                           ("nvshmem", ":")):
            pts = [(r["bytes"], r[ref]) for r in rs if isinstance(r.get(ref), (int, float))
                   and r.get(ref)]
            if len(pts) >= 2:
                ax.plot(*zip(*pts, strict=True), style, color=color, alpha=0.7,
                        label=f"{key}: {ref}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes")
    ax.set_ylabel("GB/s")
    ax.set_title(path.name, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    name = f"perf-{path.stem}.png"
    OUT.mkdir(exist_ok=True)
    tmp = OUT / (name + ".tmp")
    fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    target = OUT / name
    if target.exists() and target.read_bytes() == tmp.read_bytes():
        tmp.unlink()
    else:
        tmp.replace(target)
    return name


def _from_bench(data: dict[str, Any]) -> dict[str, Any]:
    """A ``vkshmem bench --json`` file (``meta``/``sides``/``rows`` with each side's samples)
    in the flat form of the other results files: one row per benchmark and size, a column per
    side (its median), the run's settings and command."""
    meta = data.get("meta", {})
    sides = data.get("sides", {})
    used = [name for name, side in sides.items() if not side.get("skipped")]
    rows = []
    for r in data.get("rows", []):
        row: dict[str, Any] = {"op": r.get("benchmark"), "bytes": r.get("size"),
                               "unit": r.get("unit")}
        for name in used:
            value = r.get("values", {}).get(name)
            row[name] = value.get("median") if isinstance(value, dict) else None
        rows.append(row)
    mine = sides.get("vkshmem", {})
    setting = (f"{meta.get('npes')} PEs, domain {meta.get('domain')}, routes: "
               f"{mine.get('routes', '?')}; median of {meta.get('samples')} samples")
    refs = "; ".join(f"{name}: {sides[name].get('label', '')}" for name in used
                     if name != "vkshmem")
    return {"date": meta.get("date"), "machine": meta.get("host"), "setting": setting,
            "note": f"references measured in the same run: {refs}" if refs else None,
            "command": meta.get("command"), "rows": rows}


def performance_page() -> str:
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    out = ["<!-- generated by docs/_ext/vkshmem_docs.py from benchmarks/results/*.json -->", ""]
    if not files:
        return "\n".join([*out, "No results in `benchmarks/results/`."])
    for path in files:
        data = json.loads(path.read_text())
        if "sides" in data:  # written by `vkshmem bench --json`
            data = _from_bench(data)
        rows = data.get("rows", [])
        out += [f"### `{path.name}`", ""]
        meta = [(label, _md(str(data[key]))) for key, label in _META if data.get(key)]
        if data.get("command"):
            meta.append(("Command", "`" + str(data["command"]).replace("|", "\\|") + "`"))
        if meta:
            out += ["| this run | |", "|---|---|"]
            out += [f"| {label} | {value} |" for label, value in meta] + [""]
        jobs = data.get("jobs") or []
        if jobs:
            keys = list(dict.fromkeys(k for j in jobs for k in j))
            out += ["Jobs of this run:", "", "| " + " | ".join(keys) + " |",
                    "|" + "---|" * len(keys)]
            out += ["| " + " | ".join(_num(j.get(k)) for k in keys) + " |" for j in jobs]
            out += [""]
        if not rows:
            continue
        plot = _plot(path, rows)
        if plot:
            out += [f"![Bandwidth of {path.name}](_generated/{plot})", ""]
        keys = list(dict.fromkeys(k for r in rows for k in r))
        refs = [k for k in ("cuda", "nvshmem", "ceiling", "transport", "nccl", "mpi4py",
                            "shmem4py", "ucx_perftest") if k in keys and "vkshmem" in keys]
        head = keys + [f"vkshmem vs {r}" for r in refs]
        out += ["| " + " | ".join(head) + " |",
                "|" + "|".join("---:" if k not in ("op", "pair", "unit", "domain", "route")
                               else "---" for k in keys) + "|" + "---:|" * len(refs)]
        for r in rows:
            cells = [_num(r.get(k)) if k != "bytes" or not isinstance(r.get(k), int)
                     else _size(r[k]) for k in keys]
            cells += [_ratio(r, ref) for ref in refs]
            out.append("| " + " | ".join(cells) + " |")
        out += [""]
    return "\n".join(out)



"""The outputs of ``vkshmem bench``: a table (plain or Markdown), CSV, JSON and a plot.

Every output has one row per (benchmark, size) of the plan, the median of each side and, for
each reference side, the *time ratio*: vkshmem's time per operation over the reference's
(latency: vkshmem / reference; bandwidth and rate: reference / vkshmem). Above 1, vkshmem
is slower.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .sides import Outcome
from .spec import BENCHES, UNITS, Plan, format_size, stats

__all__ = ["Report", "Row", "build_rows"]


@dataclass
class Row:
    """One line of every output."""

    bench: str
    size: int
    iters: int
    values: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # med,min,max
    samples: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return BENCHES[self.bench].kind

    @property
    def unit(self) -> str:
        return UNITS[self.kind]


def _ratio(kind: str, mine: float, ref: float) -> float:
    if mine <= 0 or ref <= 0 or math.isinf(mine) or math.isinf(ref):
        return math.nan
    return mine / ref if kind == "lat" else ref / mine


def build_rows(plan: Plan, main: Outcome, refs: list[Outcome]) -> list[Row]:
    """One row per plan item, with each side's figures and the ratios to the references."""
    rows = []
    for item in plan.items:
        row = Row(item.bench, item.size, item.iters)
        for side in (main, *refs):
            per_op = side.results.get((item.bench, item.size))
            if per_op:
                row.samples[side.name] = per_op
                row.values[side.name] = stats(row.kind, item.size, per_op)
        if main.name in row.values:
            for ref in refs:
                if ref.name in row.values:
                    row.ratios[ref.name] = _ratio(row.kind, row.values[main.name][0],
                                                  row.values[ref.name][0])
        rows.append(row)
    return rows


def fmt(value: float | None) -> str:
    """A figure with about three significant digits, ``-`` when absent."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    a = abs(value)
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


@dataclass
class Report:
    """The measurements of one invocation and how to print them."""

    plan: Plan
    main: Outcome
    refs: list[Outcome]
    skipped: list[Outcome]
    meta: dict[str, Any]

    @property
    def rows(self) -> list[Row]:
        return build_rows(self.plan, self.main, self.refs)

    def _columns(self) -> tuple[list[str], list[str]]:
        sides = [self.main.name, *(r.name for r in self.refs)]
        return sides, [f"{self.main.name}/{r.name}" for r in self.refs]

    def header(self) -> list[str]:
        """Lines that say what ran where."""
        m = self.meta
        end = f", {m['load_end']} at the end" if m.get("load_end") else ""
        lines = [f"vkshmem bench: {m['npes']} PEs, {m['domain']} memory, {m['date']}, "
                 f"{m['host']}{end}",
                 f"  command: {m['command']}"]
        for side in (self.main, *self.refs):
            lib = side.meta.get("library", "")
            note = f"; no figure for: {side.meta['failed']}" if side.meta.get("failed") else ""
            lines.append(f"  {side.name:12s} {side.label}{', ' + lib if lib else ''}{note}")
        for side in self.skipped:
            lines.append(f"  {side.name:12s} skipped: {side.skipped}")
        if self.refs and m["domain"] != "host":
            lines.append(f"  vkshmem uses {m['domain']} memory, the references host memory")
        r = m.get("rounds", 1)
        n = f"{self.plan.samples * r} samples ({r} rounds)" if r > 1 \
            else f"{self.plan.samples} samples"
        lines.append(f"  median of {n}; latency in us (lower is "
                     "better), bandwidth in GB/s and rate in million messages/s (higher is "
                     "better)")
        if self.refs:
            lines.append("  vkshmem/REF = vkshmem's time per operation over REF's (for GB/s "
                         "and Mmsg/s too): above 1, vkshmem is slower")
        return lines

    def table(self, markdown: bool = False) -> str:
        """The table (plain text, or Markdown), after the header lines."""
        sides, ratio_cols = self._columns()
        head = ["benchmark", "size", "unit", *sides, *ratio_cols]
        body = [[r.bench, format_size(r.size), r.unit,
                 *(fmt(r.values[s][0]) if s in r.values else "-" for s in sides),
                 *(fmt(r.ratios.get(ref.name)) for ref in self.refs)] for r in self.rows]
        out = io.StringIO()
        if markdown:
            out.write("```text\n" + "\n".join(self.header()) + "\n```\n\n")
            out.write("| " + " | ".join(head) + " |\n")
            out.write("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head)))
                      + "|\n")
            for cells in body:
                out.write("| " + " | ".join(cells) + " |\n")
            return out.getvalue()
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        out.write("\n".join(self.header()) + "\n\n")
        for cells in [head, *body]:
            left = [c.ljust(w) for c, w in zip(cells[:3], widths[:3], strict=True)]
            right = [c.rjust(w) for c, w in zip(cells[3:], widths[3:], strict=True)]
            out.write("  ".join(left + right).rstrip() + "\n")
        return out.getvalue()

    def csv(self) -> str:
        """One line per row: benchmark, size in bytes, unit, each side's median, the ratios."""
        sides = self._columns()[0]
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["benchmark", "size_bytes", "unit", *sides,
                    *(f"ratio_{r.name}" for r in self.refs)])
        for r in self.rows:
            w.writerow([r.bench, r.size, r.unit,
                        *(f"{r.values[s][0]:.6g}" if s in r.values else "" for s in sides),
                        *("" if math.isnan(r.ratios.get(ref.name, math.nan))
                          else f"{r.ratios[ref.name]:.4g}" for ref in self.refs)])
        return out.getvalue()

    def json(self) -> str:
        """Everything: the invocation, each side (skipped ones with the reason), each row with
        every sample (seconds per operation) and the ratios."""
        sides = {s.name: {**s.meta, "skipped": None} for s in (self.main, *self.refs)}
        sides.update({s.name: {"skipped": s.skipped} for s in self.skipped})
        rows = [{"benchmark": r.bench, "size": r.size, "unit": r.unit, "iters": r.iters,
                 "values": {name: {"median": v[0], "min": v[1], "max": v[2],
                                   "samples_s_per_op": r.samples[name]}
                            for name, v in r.values.items()},
                 "ratios": {k: (None if math.isnan(v) else v) for k, v in r.ratios.items()}}
                for r in self.rows]
        doc = {"meta": {**self.meta, "samples": self.plan.samples,
                        "window": self.plan.window},
               "sides": sides, "rows": rows}
        return json.dumps(doc, indent=1, allow_nan=False, default=str)

    def plot(self, path: str) -> None:
        """Draw every benchmark (sizes on a log axis; unsized ones as bars) into ``path``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows
        sides = self._columns()[0]
        sized = [b for b in dict.fromkeys(r.bench for r in rows) if BENCHES[b].sized]
        bars = [r for r in rows if not BENCHES[r.bench].sized]
        panels = len(sized) + (1 if bars else 0)
        cols = min(4, max(1, panels))
        nrows = math.ceil(panels / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows),
                                 squeeze=False)
        flat = [ax for line in axes for ax in line]
        for ax, bench in zip(flat, sized, strict=False):
            mine = [r for r in rows if r.bench == bench]
            for side in sides:
                pts = [(r.size, r.values[side][0]) for r in mine if side in r.values]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=side)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(bench)
            ax.set_xlabel("bytes")
            ax.set_ylabel(mine[0].unit)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
        if bars:
            ax = flat[len(sized)]
            width = 0.8 / len(sides)
            for k, side in enumerate(sides):
                xs = [i + k * width for i, r in enumerate(bars) if side in r.values]
                ys = [r.values[side][0] for r in bars if side in r.values]
                ax.bar(xs, ys, width, label=side)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(bars))])
            ax.set_xticklabels([r.bench for r in bars], rotation=60, fontsize="small")
            ax.set_ylabel("us")
            ax.set_title("AMOs and barrier (8 B)")
            ax.legend(fontsize="small")
        for ax in flat[panels:]:
            ax.set_visible(False)
        m = self.meta
        fig.suptitle(f"vkshmem bench, {m['npes']} PEs, {m['domain']} memory, {m['date']}")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

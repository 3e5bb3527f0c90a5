"""Tables and plots from benchmark results: ``python benchmarks/report.py results.json``.

A results file (``benchmarks/bench.py`` writes it) becomes ``results.md`` (per group: best and
all times, ratio to the group's baseline measured in the same run, CPU-seconds of client and
servers, the ceiling they imply, verification) and PNG plots (time and speedup by degree, one
line per method). Benchmark-only code: it lives beside the benchmark, not in the package.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _baseline(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    for cell in cells:
        if cell.get("baseline"):
            return cell
    for cell in cells:
        if cell.get("method") in ("pipe", "duckdb") and cell.get("degree", 1) == 1:
            return cell
    return None


def results_markdown(results: dict[str, Any]) -> str:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for cell in results["cells"]:
        groups[cell["group"]].append(cell)
    v = results.get("versions", {})
    lines = [f"# Benchmark: TPC-H SF{results['settings'].get('sf')}, best of {results['settings'].get('repeat')}",
             "", f"machine: {v.get('cores')} cores {v.get('machine')}, python {v.get('python')}, "
             + ", ".join(f"{k} {v[k]}" for k in ("conveyor", "pyarrow", "duckdb", "adbc-driver-postgresql", "ray") if k in v), ""]
    for group, cells in groups.items():
        if group == "memory":
            lines += _memory_table(cells)
            continue
        base = _baseline(cells)
        peaks = any("peak_rss_mb" in c for c in cells)  # jobs run as processes of their own: their peak resident memory
        lines += [f"## {group}", "", "| job | best s | all s | median s | vs baseline | CPU-s client / source / target | ceiling s | "
                  "target WAL MB | " + ("peak RSS MB (each run) | " if peaks else "") + "verified |",
                  "|---|---:|---|---:|---:|---|---:|---:|" + ("---:|" if peaks else "") + "---|"]
        for c in cells:
            ratio = f"{base['best'] / c['best']:.2f}x" if base else ""
            cpu = c["cpu"]
            wal = f"{c['target_wal_bytes'] / 1e6:,.0f}" if c.get("target_wal_bytes") is not None else ""
            rss = (f"{c['peak_rss_mb']:,.0f} ({' '.join(f'{m:,.0f}' for m in c['peak_rss_mb_all'] if m is not None)}) | "
                   if "peak_rss_mb" in c else "| " if peaks else "")
            lines.append(f"| {c['name']} | {c['best']:.2f} | {' '.join(f'{t:.2f}' for t in c['seconds'])} | {statistics.median(c['seconds']):.2f} | "
                         f"{ratio} | {cpu['client']:.1f} / {cpu['source_server']:.1f} / {cpu['target_server']:.1f} | {c['ceiling_s']:.2f} | "
                         f"{wal} | {rss}{'ok' if c['verified'] else 'MISMATCH'} |")
        startup = next((c["ray_startup_s"] for c in cells if "ray_startup_s" in c), None)
        if startup is not None:
            lines += ["", f"ray.init() on this machine: {startup:.2f} s (paid once per `conveyor run runtime=ray` that starts its own instance)"]
        lines.append("")
    lines += _targets(results["cells"])
    return "\n".join(lines)


def _targets(cells: list[dict[str, Any]]) -> list[str]:
    """Every target a cell carries (``goal``: its time at most ``at_most`` x another cell's of the same
    run; ``goal_within``: at most ``seconds`` more than another's; ``goal_memory``: its peak resident memory
    at most ``at_most`` x another's, both as processes of their own, the largest peak of each job's runs),
    marked met or missed."""
    by_name = {(c["group"], c["name"]): c for c in cells}
    rows = []
    for c in cells:
        for kind in ("goal", "goal_within", "goal_memory"):
            goal = c.get(kind)
            if not goal:
                continue
            other = by_name.get((c["group"], goal["against"]))
            if other is None:
                continue
            pairs = _paired(c, other)
            if kind == "goal_memory":
                mine, theirs = _peak(c), _peak(other)
                if mine is None or theirs is None:
                    continue
                met = mine <= goal["at_most"] * theirs and c["verified"]
                measured = f"{mine:,.0f} MB against {theirs:,.0f} MB: {mine / theirs:.2f}x; target at most {goal['at_most']:.2f}x"
            elif kind == "goal":
                ratio = c["best"] / other["best"]
                met = ratio <= goal["at_most"] and c["verified"]
                measured = (f"{ratio:.2f}x its time ({other['best'] / c['best']:.2f}x the speed)"
                            f"{_by_round([a / b for a, b in pairs], '{:.2f}', 'x')}; target at most {goal['at_most']:.2f}x")
            else:
                diff = c["best"] - other["best"]
                met = diff <= goal["seconds"] and c["verified"]
                measured = f"{diff:+.2f} s{_by_round([a - b for a, b in pairs], '{:+.2f}', ' s')}; target at most +{goal['seconds']:.2f} s"
            rows.append(f"| {c['group']} | {c['name']} | {goal['what']} (vs {goal['against']}) | {measured} | "
                        f"{'**met**' if met else '**missed**'} |")
    if not rows:
        return []
    return ["## Targets", "", "Met or missed on the best times; where a job ran in rounds with its baseline (one run of each per "
            "round), each round's ratio and their median are given too.", "",
            "| group | job | target | measured (best of the run) | |", "|---|---|---|---|---|", *rows, ""]


def _peak(cell: dict[str, Any]) -> float | None:
    """The largest peak resident MB of a cell's runs (None if it ran in the bench's process)."""
    peaks = [m for m in cell.get("peak_rss_mb_all") or [] if m is not None]
    return max(peaks) if peaks else None


def _by_round(values: list[float], fmt: str, unit: str) -> str:
    """"; round by round ..., median ..." of a job's ratios or differences to its baseline ("" if none)."""
    if not values:
        return ""
    return f"; round by round {' '.join(fmt.format(x) for x in values)}{unit}, median {fmt.format(statistics.median(values))}{unit}"


def _paired(cell: dict[str, Any], other: dict[str, Any]) -> list[tuple[float, float]]:
    """(its seconds, the other's) of each round, where the two ran in the same rounds ([] if not)."""
    if other["name"] not in cell.get("rounds_with", ()) or len(cell["seconds"]) != len(other["seconds"]):
        return []
    return list(zip(cell["seconds"], other["seconds"]))


def _memory_table(cells: list[dict[str, Any]]) -> list[str]:
    """Peak resident memory of each job's process, by scale factor (the same settings at every size)."""
    lines = ["## memory: peak resident memory per job process", "",
             "| job | rows | seconds | peak RSS MB | verified |", "|---|---:|---:|---:|---|"]
    for c in cells:
        lines.append(f"| {c['name']} | {c['rows']:,} | {c['best']:.2f} | {c['peak_rss_mb']:.0f} | {'ok' if c['verified'] else 'MISMATCH'} |")
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in cells:
        by_job[c["method"]].append(c)
    for job, runs in by_job.items():
        if len(runs) > 1 and not runs[0].get("baseline"):
            small, large = min(runs, key=lambda c: c["rows"]), max(runs, key=lambda c: c["rows"])
            growth = large["peak_rss_mb"] / small["peak_rss_mb"] - 1
            lines.append(f"\n{job}: {large['rows'] / small['rows']:.1f}x the rows, peak RSS {growth:+.1%} "
                         f"(target: flat within 10%: {'met' if growth <= 0.10 else 'missed'}; one run per size)")
    # Parquet->PG's memory against DuckDB's on the same files (the issue's "client RSS no more than twice DuckDB's")
    duck = {c["sf"]: c for c in cells if c.get("baseline")}
    for c in cells:
        base = duck.get(c.get("sf"))
        if base is None or c.get("baseline") or not c["method"].startswith("parquet->pg"):
            continue
        ratio = c["peak_rss_mb"] / base["peak_rss_mb"]
        lines.append(f"\n{c['name']}: peak RSS {c['peak_rss_mb']:.0f} MB = {ratio:.2f}x DuckDB's {base['peak_rss_mb']:.0f} MB "
                     f"(target: at most 2x: {'met' if ratio <= 2.0 else 'missed'}; one run each)")
    lines.append("")
    return lines


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    """Time and speedup by degree per method, one PNG per group (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return []
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for cell in results["cells"]:
        groups[cell["group"]].append(cell)
    written = []
    for group, cells in groups.items():
        if group == "memory":
            continue
        base = _baseline(cells)
        # one degree, or the shipped defaults (DuckDB's one stream beside the pipelines' degrees): one bar per job
        if len({c.get("degree", 1) for c in cells}) == 1 or group.startswith("shipped defaults"):
            written.append(_bars(group, cells, base, out, plt))
            continue
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for c in cells:
            label = c["name"].rsplit(" degree=", 1)[0].replace("conveyor ", "")
            series[label].append((c.get("degree", 1), c["best"]))
        # the legend goes below both axes, one row per job: inside the time axis it covered the lines when the
        # job names were long (the best-configuration groups' "(replace)", "(UNLOGGED ...)" labels)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4 + 0.2 * len(series)))
        for label, points in series.items():
            points.sort()
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            ax1.plot(xs, ys, marker="o", label=label)
            if base:
                ax2.plot(xs, [base["best"] / y for y in ys], marker="o", label=label)
        ax1.set(title=f"{group}: time", xlabel="degree", ylabel="seconds (best)")
        ax2.set(title="speedup vs baseline (same run)", xlabel="degree", ylabel="x")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.set_xticks(sorted({x for points in series.values() for x, _ in points}))  # degrees: whole numbers
        handles, labels = ax1.get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0.2 * len(series) / (4 + 0.2 * len(series)) + 0.02, 1, 1))
        fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=7, frameon=False)
        path = out / f"plot_{re.sub(r'[^a-z0-9]+', '_', group.lower()).strip('_')}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def _bars(group: str, cells: list[dict[str, Any]], base: dict[str, Any] | None, out: Path, plt: Any) -> Path:
    """Best seconds per job, the baseline's bar first, each labelled with its ratio to the baseline."""
    names = [c["name"].replace("conveyor run ", "") for c in cells][::-1]
    # the bars' own width beside the longest job name (about 0.075 inch a character at this font size)
    fig, ax = plt.subplots(figsize=(7 + 0.075 * max(map(len, names)), 0.55 * len(cells) + 1.2))
    best = [c["best"] for c in cells][::-1]
    colors = ["#888888" if base is not None and c is base else "#1f77b4" for c in cells][::-1]
    ax.barh(names, best, color=colors)
    for y, (c, t) in enumerate(zip(cells[::-1], best)):
        ratio = f"  {t:.2f} s" + (f" ({t / base['best']:.2f}x the baseline's time)" if base is not None and c is not base else "")
        ax.text(t, y, ratio, va="center", fontsize=8)
    ax.set(title=f"{group}: best of the run, seconds (whole process)", xlabel="seconds")
    ax.set_xlim(0, max(best) * 1.6)
    fig.tight_layout()
    path = out / f"plot_{re.sub(r'[^a-z0-9]+', '_', group.lower()).strip('_')}.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")  # long job names: the figure grows instead of cutting the title
    plt.close(fig)
    return path


def render(path: Path | str) -> str:
    """results.md and the plots for a results.json (or the folder holding it); the markdown."""
    path = Path(path)
    results_file = path / "results.json" if path.is_dir() else path
    results = json.loads(results_file.read_text())
    md = results_markdown(results)
    (results_file.parent / "results.md").write_text(md)
    pngs = plots(results, results_file.parent)
    return md + ("\n\nplots: " + ", ".join(str(p) for p in pngs) if pngs else "")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/report.py RESULTS.json")
    print(render(sys.argv[1]))

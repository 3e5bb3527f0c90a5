"""bench.py's clickhouse group: PostgreSQL -> ClickHouse and ClickHouse -> Parquet on a throwaway ClickHouse
server, against the raw pipes measured in the same run:

- pg->clickhouse: ``psql -c "COPY t TO STDOUT" | clickhouse-client --query "INSERT INTO t FORMAT TSV"`` (the
  server parses PostgreSQL's text COPY as TSV: tab, \\N, backslash escapes).
- clickhouse->parquet: ``clickhouse-client --query "SELECT * FROM t FORMAT Native" > file``: the server's own
  export, the floor of any reader (18.16 has no Parquet or Arrow output format, and DuckDB has no extension
  that reaches ClickHouse: there is no DuckDB baseline).

The ClickHouse server's CPU-seconds are read from its process (``clickhouse_server`` in each cell's meta).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any


def run(bench: Any, table: str, degrees: list[int], key: str, work: Path, conveyor: Any, ticks: Any) -> None:
    from conveyor.testing.chserver import ClickHouseServer

    with ClickHouseServer("bench-clickhouse") as ch:
        os.environ["CLICKHOUSE_PASSWORD"] = ch.password
        conn = {"type": "clickhouse", "port": ch.http_port}
        src = {"type": "postgres", "port": bench.src.port, "table": table}
        # the target's definition as Conveyor makes it (the source's types, sorted by its key), kept as a template
        conveyor({"source": src, "sink": {**conn, "table": f"{table}_tpl", "order_by": [key]}, "strategy": {"type": "ctid"},
                  "load_mode": "create", "degree": 2})
        rows, total = ch.execute(f"SELECT count(), sum({key}) FROM {table}_tpl")[0]
        dest = f"{table}_in"

        def reset() -> None:
            ch.execute(f"DROP TABLE IF EXISTS {dest}", f"CREATE TABLE {dest} AS {table}_tpl")

        def verify() -> bool:
            return ch.execute(f"SELECT count(), sum({key}) FROM {dest}")[0] == [rows, total]

        client = ["clickhouse-client", "--host", "127.0.0.1", "--port", str(ch.tcp_port), "--password", ch.password]

        def raw_in() -> None:
            env = {**os.environ, "PGPASSWORD": bench.src.password}
            copy = subprocess.Popen(["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(bench.src.port), "-U", "postgres",
                                     "-c", f"COPY {table} TO STDOUT"], env=env, stdout=subprocess.PIPE)
            subprocess.run([*client, "--query", f"INSERT INTO {dest} FORMAT TSV"], stdin=copy.stdout, check=True)
            copy.stdout.close()
            if copy.wait():
                raise RuntimeError("psql COPY failed")

        def server_cpu() -> float:
            return ticks(ch._proc.pid) if ch._proc is not None else 0.0

        group = f"pg->clickhouse {table}"
        jobs = [("baseline psql COPY piped into clickhouse-client TSV", raw_in, verify, {"method": "pipe", "degree": 1})]
        for degree in degrees:
            cfg = {"source": src, "sink": {**conn, "table": dest}, "strategy": {"type": "ctid"}, "load_mode": "append", "degree": degree}
            jobs.append((f"conveyor ctid degree={degree}", lambda c=cfg: conveyor(c), verify, {"method": "ctid", "degree": degree}))
        _rounds(bench, group, jobs, reset, server_cpu)

        out = work / "ch_out"
        group = f"clickhouse->parquet {table}"
        ch.execute(f"DROP TABLE IF EXISTS {dest}", f"CREATE TABLE {dest} AS {table}_tpl", f"INSERT INTO {dest} SELECT * FROM {table}_tpl")

        def raw_out() -> None:
            with open(work / "ch_out.native", "wb") as f:
                subprocess.run([*client, "--query", f"SELECT * FROM {dest} FORMAT Native"], stdout=f, check=True)

        def parquet_rows() -> bool:
            import pyarrow.dataset as ds

            return str(ds.dataset(out).count_rows()) == rows

        jobs = [("baseline clickhouse-client SELECT FORMAT Native > file", raw_out, lambda: (work / "ch_out.native").stat().st_size > 0,
                 {"method": "raw", "degree": 1})]
        for degree in degrees:
            strategy = {"type": "rangeid", "distribute_key": key} if degree > 1 else {"type": "none"}
            cfg = {"source": {**conn, "table": dest}, "sink": {"type": "parquet", "path": str(out)}, "strategy": strategy,
                   "load_mode": "replace", "degree": degree}
            jobs.append((f"conveyor {strategy['type']} degree={degree}", lambda c=cfg: conveyor(c), parquet_rows,
                         {"method": strategy["type"], "degree": degree}))
        _rounds(bench, group, jobs, lambda: None, server_cpu)


def _rounds(bench: Any, group: str, jobs: list, reset: Any, server_cpu: Any) -> None:
    """bench.rounds, with the ClickHouse server's CPU-seconds of each job's last run in its cell."""
    spent: dict[str, float] = {}

    def counted(name: str, job: Any) -> Any:
        def run() -> None:
            before = server_cpu()
            job()
            spent[name] = round(server_cpu() - before, 2)
        return run

    cells = bench.rounds(group, [(name, counted(name, job), verify, meta) for name, job, verify, meta in jobs], reset)
    for cell in cells:
        cell["cpu"]["clickhouse_server"] = spent.get(cell["name"], 0.0)
        print(f"{group:28} {cell['name']:44} clickhouse server cpu {cell['cpu']['clickhouse_server']:.1f} s (last round)", flush=True)

"""The README and the shipped pipelines' comments as a contract: every command they show runs as written.

Each ```bash block of README.md runs as one bash script (set -e) in a sandbox folder laid out as
after `make demo` (demo-data/orders/*.parquet), with the tests' own services standing in for the
user's: the block's `export` lines are the only lines not run (they set the user's server and
cluster addresses; the test sets the same variables to its throwaway PostgreSQL server, S3 endpoint
and Ray cluster). Every `#   conveyor ...` example in configs/pipeline/*.yaml runs the same way.
The cluster block runs in tests/runtime/test_ray_cluster.py, beside the cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import duckdb
import pyarrow.dataset as ds

from tests.helpers import BIN, REPO, checksum, pg_exec

#: lines of the README that are not run here, and where they are run instead
ELSEWHERE = {
    "make demo": "tests/integration/test_cli.py::test_make_demo_from_the_makefile",
    "make test": "it is this test suite",
}


def pages() -> list[Path]:
    """The README, then the documentation's pages: their commands are one user's session, in that order."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def bash_blocks() -> list[str]:
    return [b for page in pages() for b in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)]


def python_blocks() -> list[str]:
    """The Python blocks a user runs as they are (not the recipes for orchestrators this suite does not install)."""
    found = [b for page in pages() for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
    skipped = ("from airflow", "from prefect", "class ", "conveyor.testing")  # recipes, and a connector's own code (tested apart)
    return [b for b in found if not any(x in b for x in skipped)]


def pipeline_examples() -> list[str]:
    """The `#   conveyor ...` commands in the shipped pipelines' comments (continuations joined)."""
    found = []
    for path in sorted((REPO / "configs" / "pipeline").glob("*.yaml")):
        text = re.sub(r"\\\n#\s+", " ", path.read_text())
        found += [m.strip() for m in re.findall(r"^#\s+(conveyor .*)$", text, re.M)]
    return found


def script(block: str) -> str:
    lines = [line for line in block.splitlines() if line.strip() and not line.startswith("export ")]
    lines = [line for line in lines if not any(line.startswith(cmd) for cmd in ELSEWHERE)]
    return "set -euo pipefail\n" + "\n".join(lines) + "\n"


def run_block(block: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    full = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "COLUMNS": "200", **env}
    return subprocess.run(["bash", "-c", script(block)], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


def sandbox(tmp_path: Path, tpch_orders: Path) -> Path:
    """A folder as `make demo` leaves the checkout: demo-data/orders/*.parquet."""
    box = tmp_path / "checkout"
    shutil.copytree(tpch_orders, box / "demo-data" / "orders")
    return box


def test_every_readme_command_that_needs_no_cluster_runs_as_written(tpch_orders: Path, pg_source, s3, clickhouse_server, mysql_server,
                                                                    tmp_path: Path) -> None:
    box = sandbox(tmp_path, tpch_orders)
    env = {"PGHOST": "127.0.0.1", "PGPORT": str(pg_source.port), "CLICKHOUSE_HTTP_PORT": str(clickhouse_server.http_port),
           "CLICKHOUSE_PASSWORD": clickhouse_server.password, "MYSQL_HOST": "127.0.0.1", "MYSQL_TCP_PORT": str(mysql_server.port),
           "MYSQL_USER": mysql_server.user, "MYSQL_DATABASE": mysql_server.database, "MYSQL_PWD": mysql_server.password}
    clickhouse_server.execute("DROP TABLE IF EXISTS orders")
    mysql_server.execute("DROP TABLE IF EXISTS accounts")
    # and what another module of this worker may have left on the same server (test_ray_cluster.py runs the Ray Data block
    # on a two-column orders): the blocks start from the state a reader's server has
    pg_exec(pg_source, "DROP TABLE IF EXISTS orders", "DROP TABLE IF EXISTS orders_copy", "DROP TABLE IF EXISTS orders_taxed")
    blocks = [b for b in bash_blocks() if "conveyor submit" not in b and "conveyor new connector" not in b]
    assert len(blocks) >= 5, "the README's and the docs' blocks moved: check this test still runs them"
    for block in blocks:
        proc = run_block(block, box, env)
        assert proc.returncode == 0, f"README block failed:\n{block}\n--- stderr:\n{proc.stderr[-3000:]}"
    # what they did: the demo into DuckDB, orders into PostgreSQL, copied, and out as Parquet
    con = duckdb.connect(str(box / "my.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM orders").fetchone()[0] == 15000
    con.close()
    assert checksum(pg_source, "orders_copy") == checksum(pg_source, "orders") and checksum(pg_source, "orders")[0] == 15000
    assert ds.dataset(box / "out" / "orders").count_rows() == 15000
    assert ds.dataset(box / "out" / "ch_orders").count_rows() == 15000  # PostgreSQL -> ClickHouse -> Parquet (docs/clickhouse.md)
    assert ds.dataset(box / "out" / "from_iceberg").count_rows() == 15000  # PostgreSQL -> Iceberg -> Parquet (docs/iceberg.md)
    assert ds.dataset(box / "out" / "from_delta").count_rows() == 15000  # PostgreSQL -> Delta -> Parquet (docs/delta.md)
    con = duckdb.connect(str(box / "accounts.duckdb"), read_only=True)  # MariaDB -> DuckDB, synced (docs/sync.md)
    assert con.execute("SELECT count(*), sum(balance) FROM accounts").fetchone() == tuple(
        mysql_server.execute("SELECT count(*), sum(balance) FROM accounts")[0]) == (9990, 499051449)
    con.close()
    # and the Python blocks, with the same server (the Python API reads PGHOST / PGPORT as the command line does)
    python = python_blocks()
    assert len(python) >= 3, "the README's and the docs' Python blocks moved: check this test still runs them"
    for block in python:
        proc = subprocess.run([str(BIN / "python"), "-c", block], cwd=box, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"README Python block failed:\n{block}\n--- stderr:\n{proc.stderr[-3000:]}"
    assert ds.dataset(box / "out" / "from_python").count_rows() == 15000


def test_every_pipeline_example_runs_as_written(tpch_orders: Path, pg_source, s3, mysql_server, clickhouse_server, tmp_path: Path) -> None:
    """The commands the shipped pipelines suggest in their comments (on main: parquet_to_duckdb
    without load_mode=create failed, pg_to_pg named hosts that do not exist)."""
    box = sandbox(tmp_path, tpch_orders)
    env = {"PGHOST": "127.0.0.1", "PGPORT": str(pg_source.port), "MYSQL_HOST": "127.0.0.1", "MYSQL_TCP_PORT": str(mysql_server.port),
           "MYSQL_USER": mysql_server.user, "MYSQL_DATABASE": mysql_server.database, "MYSQL_PWD": mysql_server.password,
           "CLICKHOUSE_HTTP_PORT": str(clickhouse_server.http_port), "CLICKHOUSE_PASSWORD": clickhouse_server.password}
    mysql_server.execute("DROP TABLE IF EXISTS orders")
    clickhouse_server.execute("DROP TABLE IF EXISTS orders")
    pg_exec(pg_source, "DROP TABLE IF EXISTS orders_from_mysql")
    client = s3.client()
    if "bucket" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="bucket")
    for f in sorted(tpch_orders.iterdir()):
        client.upload_file(str(f), "bucket", f"orders/{f.name}")
    pg_exec(pg_source, "DROP TABLE IF EXISTS orders", "DROP TABLE IF EXISTS orders_copy")
    pg_exec(pg_source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database IN ('app', 'app_new')",
            "DROP DATABASE IF EXISTS app WITH (FORCE)", "DROP DATABASE IF EXISTS app_new WITH (FORCE)", "CREATE DATABASE app",
            "CREATE DATABASE app_new")  # pg_migrate's: a database to move, and an empty one to move it to
    pg_exec(pg_source, "CREATE TABLE items (id int PRIMARY KEY, name text UNIQUE)", "INSERT INTO items SELECT g, 'i' || g FROM generate_series(1, 500) g",
            dbname="app")
    examples = pipeline_examples()
    assert {e.split()[2] for e in examples} == {f"pipeline={p.stem}" for p in (REPO / "configs" / "pipeline").glob("*.yaml")} - {"pipeline=demo"}
    # the DuckDB example reads the table the README's own example made; order them as a user would
    first = ["conveyor run source=parquet source.path='demo-data/orders/*.parquet' sink=duckdb sink.database=my.duckdb "
             "sink.table=orders load_mode=replace runtime=local"]
    order = ["parquet_to_postgres", "pg_to_pg", "postgres_to_parquet", "pg_to_mysql", "mysql_to_pg", "mysql_to_parquet",
             "pg_to_clickhouse", "clickhouse_to_parquet", "pg_to_iceberg", "pg_to_delta",
             "parquet_to_duckdb", "duckdb_to_parquet", "s3_parquet_to_postgres", "pg_migrate"]
    examples.sort(key=lambda e: order.index(e.split()[2].split("=")[1]))
    for command in first + examples:
        proc = run_block(command, box, env)
        assert proc.returncode == 0, f"{command}\n--- stderr:\n{proc.stderr[-3000:]}"
    assert checksum(pg_source, "orders_copy")[0] == 15000
    assert pg_exec(pg_source, "SELECT count(*), count(DISTINCT name) FROM items", dbname="app_new") == [(500, 500)]  # migrated, cut over
    assert pg_exec(pg_source, "SELECT count(*) FROM pg_indexes WHERE tablename = 'items'", dbname="app_new") == [(2,)]
    assert pg_exec(pg_source, "SELECT count(*) FROM pg_replication_slots WHERE database = 'app'") == [(0,)]
    assert pg_exec(pg_source, "SELECT count(*) FROM orders")[0][0] == 30000  # replaced, then the S3 files appended
    assert ds.dataset(box / "out" / "from_duckdb").count_rows() == 15000
    assert checksum(pg_source, "orders_from_mysql") == checksum(pg_source, "orders_copy")  # PostgreSQL -> MySQL -> PostgreSQL
    assert ds.dataset(box / "out" / "from_mysql").count_rows() == 15000
    assert clickhouse_server.execute("SELECT count(), uniqExact(o_orderkey) FROM orders")[0] == ["15000", "15000"]
    assert ds.dataset(box / "out" / "from_clickhouse").count_rows() == 15000
    from deltalake import DeltaTable
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("default", type="sql", uri=f"sqlite:///{box}/lake/catalog.db", warehouse=f"file://{box}/lake/warehouse")
    assert len(catalog.load_table("tpch.orders").scan().to_arrow()) == 15000
    assert DeltaTable(str(box / "lake" / "orders")).count() == 15000


def test_the_readme_connector_template_commands_run_as_written(tmp_path: Path) -> None:
    """`conveyor new connector mysource`, then pip install -e . and its own tests, then a run by name."""
    block = next(b for b in bash_blocks() if "conveyor new connector" in b)
    try:
        proc = run_block(block, tmp_path, {}, timeout=900)
        assert proc.returncode == 0, f"{block}\n--- stdout:\n{proc.stdout[-2000:]}\n--- stderr:\n{proc.stderr[-3000:]}"
        assert "passed" in proc.stdout and ds.dataset(tmp_path / "conveyor-mysource" / "out").count_rows() > 0
    finally:
        subprocess.run([str(BIN / "python"), "-m", "pip", "uninstall", "--quiet", "-y", "conveyor-mysource"], capture_output=True, timeout=120)


def test_the_readme_quick_starts_run_in_a_fresh_virtualenv_with_only_its_extras(tpch_orders: Path, pg_source, tmp_path: Path) -> None:
    """A newcomer's session: a virtualenv of their own with only the extras the README's install section names (no
    test tools, no other extra), then the README's commands and its Python block as written (on the main this
    started from, a first PostgreSQL job failed with an internal error: the postgres extra was never named)."""
    import sys

    extras = re.search(r"pip install '\.(\[[a-z,]+\])'", (REPO / "README.md").read_text())
    assert extras, "the README's install line moved: check this test still reads it"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{REPO}{extras.group(1)}"], capture_output=True,
                         text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    box = sandbox(tmp_path, tpch_orders)
    env = {"PGHOST": "127.0.0.1", "PGPORT": str(pg_source.port), "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    pg_exec(pg_source, "DROP TABLE IF EXISTS orders", "DROP TABLE IF EXISTS orders_copy")
    readme = (REPO / "README.md").read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", readme, re.S) if "conveyor submit" not in b and "conveyor new connector" not in b]
    for block in blocks:
        proc = subprocess.run(["bash", "-c", script(block)], cwd=box, env={**os.environ, "COLUMNS": "200", **env}, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"README block failed in a fresh virtualenv:\n{block}\n--- stderr:\n{proc.stderr[-3000:]}"
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", block], cwd=box, env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"README Python block failed in a fresh virtualenv:\n{block}\n--- stderr:\n{proc.stderr[-3000:]}"
    assert checksum(pg_source, "orders_copy") == checksum(pg_source, "orders") and ds.dataset(box / "out" / "from_python").count_rows() == 15000

"""Shared fixtures: the CLI as a subprocess, and TPC-H data made by tpchgen-cli."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import pytest

# Under pytest-xdist (make test runs two workers) each worker's Ray has a folder of its own: its instances, their
# sockets and the address file `ray start` leaves for ray.init() (and Conveyor) to find are then its own, so one
# worker's runs never join the other's `ray start` cluster.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["RAY_TMPDIR"] = f"/tmp/conveyor-{os.environ['PYTEST_XDIST_WORKER']}"
    os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)

from tests.helpers import BIN, PG_PASSWORD, REPO, CliResult, pg_exec, run_cli  # noqa: F401  (fixtures use them; tests import them from tests.helpers)


@pytest.fixture
def cli(tmp_path: Path):
    """`conveyor run/plan` with the Hydra run directory kept under the test's tmp_path."""

    def _run(*args: str, **kw: object) -> CliResult:
        extra: list[str] = []
        if args and args[0] == "run":
            extra = [f"hydra.run.dir={tmp_path}/hydra-run", f"hydra.sweep.dir={tmp_path}/hydra-multirun"]
        return run_cli(*args, *extra, cwd=kw.pop("cwd", tmp_path), **kw)  # type: ignore[arg-type]

    return _run


@pytest.fixture(scope="session")
def tpch_orders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TPC-H orders at SF 0.01 (15,000 rows) as 4 Parquet files, made by tpchgen-cli."""
    out = tmp_path_factory.mktemp("tpch")
    tool = shutil.which("tpchgen-cli", path=str(BIN)) or shutil.which("tpchgen-cli")
    assert tool, "tpchgen-cli is not installed (make test installs it)"
    subprocess.run(
        [tool, "parquet", "-s", "0.01", "--tables=orders", "--parts=4", f"--output-dir={out}"],
        check=True, capture_output=True, timeout=120,
    )
    return out / "orders"


# --- a throwaway MariaDB (MySQL) server, started once per test session --------------------------


@pytest.fixture(scope="session")
def mysql_server():
    """A MariaDB server on a loopback port in a temp folder, run as the unprivileged mysql user, its binary log on (ROW: what
    a sync from it reads)."""
    from conveyor.testing.mysqlserver import BINLOG, MySqlServer

    server = MySqlServer(settings=dict(BINLOG))
    os.environ["MYSQL_PWD"] = server.password  # what the mysql connectors' password_env reads by default
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --- a throwaway ClickHouse server, started once per test session ---------------------------------


@pytest.fixture(scope="session")
def clickhouse_server():
    """A ClickHouse server on loopback ports in a temp folder, run as the unprivileged clickhouse user."""
    from conveyor.testing.chserver import ClickHouseServer

    server = ClickHouseServer()
    os.environ["CLICKHOUSE_PASSWORD"] = server.password  # what the clickhouse connectors' password_env reads by default
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --- throwaway PostgreSQL servers (source and target), started once per test session ----------



#: the PostgreSQL versions of the matrix: a module marked ``pg_versions`` runs its tests on each (its ``pg_servers``, and
#: so ``pg_source`` / ``pg_target``, of that version); every other test on the servers scripts/ensure-postgres.sh installs
PG_VERSIONS = ("15", "18")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``pg_versions`` on a module: its tests on each version of the matrix; on a test, with versions named
    (``@pytest.mark.pg_versions("15")``): on those only (a heavy test whose subject is not the server's version)."""
    marker = metafunc.definition.get_closest_marker("pg_versions")
    if "pg_servers" in metafunc.fixturenames and marker is not None:
        versions = marker.args or PG_VERSIONS
        metafunc.parametrize("pg_servers", versions, indirect=True, scope="session", ids=[f"pg{v}" for v in versions])


@pytest.fixture(scope="session")
def pg_servers(request):
    """Two PostgreSQL servers on loopback ports in temp folders, run as an unprivileged user: of the matrix's version
    where the module asks for it (``pytestmark = pytest.mark.pg_versions``), else the first (Debian's 15)."""
    from conveyor.testing.pgserver import PgServer

    version = getattr(request, "param", "")  # "": $PG_BINDIR's, else the highest installed (Debian's 15, scripts/ensure-postgres.sh)
    servers = [PgServer(name, password=PG_PASSWORD, logical=name == "source", version=version) for name in ("source", "target")]
    os.environ["PGPASSWORD"] = PG_PASSWORD  # what password_env reads by default
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def pg_password(monkeypatch):
    """PGPASSWORD set to the test servers' password for one test (``password_env``'s default), whatever
    a test before it did to the environment: a module takes it with ``pytestmark = pytest.mark.usefixtures("pg_password")``."""
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)


@pytest.fixture(scope="session")
def pg_source(pg_servers):
    return pg_servers[0]


@pytest.fixture(scope="session")
def pg_target(pg_servers):
    return pg_servers[1]


# --- an S3-compatible server on loopback (moto), with authentication -----------------------


@pytest.fixture(scope="session")
def s3():
    from conveyor.testing.s3server import S3Server

    server = S3Server().start()
    try:
        with mock.patch.dict(os.environ, server.env()):
            yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_orders(s3, tpch_orders: Path) -> str:
    """TPC-H orders as 4 Parquet files in s3://conveyor-test/orders/."""
    client = s3.client()
    client.create_bucket(Bucket="conveyor-test")
    for f in sorted(tpch_orders.iterdir()):
        client.upload_file(str(f), "conveyor-test", f"orders/{f.name}")
    return "s3://conveyor-test/orders"


# --- a real Ray instance (2 CPUs), per test module ----------------------------------------------


@pytest.fixture(scope="module")
def ray_instance(pg_servers):
    """A real Ray instance for one module; started after the servers so workers see PGPASSWORD.

    The test-only sources in tests/runtime/faults.py travel to the workers by value.
    """
    import logging

    import ray
    from ray import cloudpickle

    from tests.runtime import faults

    cloudpickle.register_pickle_by_value(faults)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 * 1024,
             logging_level=logging.WARNING, log_to_driver=False)
    yield ray
    ray.shutdown()


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (``timeout``, a CI runner stopping the job) unwinds like Ctrl-C: pytest then tears the
    session's fixtures down, so the throwaway PostgreSQL and MariaDB servers are stopped and their
    folders removed (under the default SIGTERM the process just ended, and they kept running)."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, interrupt)


_SLOW_FIXTURES = {"ray_instance", "s3", "installed_plugin", "tpch_orders"}


#: the fixtures that start a server or a Ray instance
_SERVER_FIXTURES = {"pg_servers", "mysql_server", "clickhouse_server", "s3", "ray_instance"}


#: the modules that take longest (``--durations``, this machine), heaviest first: ``make test`` hands whole modules to its
#: workers in collection order (``--dist loadfile --no-loadscope-reorder``), so these start first and the suite does not end
#: on one worker running a long module alone (xdist's default order, most tests first, put them last). A module not named
#: here runs after them, in its own order.
HEAVY_FIRST = ["connectors/test_lake.py", "integration/test_readme.py", "connectors/test_mysql_sync.py", "runtime/test_ray_cluster.py",
               "connectors/postgres/test_sync.py", "integration/test_exactly_once.py", "integration/test_corpus.py",
               "connectors/test_clickhouse.py", "connectors/test_mysql_exactly_once.py", "integration/test_cli.py", "runtime/test_ray.py",
               "connectors/postgres/test_migrate.py", "connectors/test_clickhouse_sync.py", "integration/test_many_tables.py",
               "connectors/test_suites.py", "runtime/test_ray_data.py", "integration/test_pipelines.py"]


def _weight_order(items: list[pytest.Item]) -> None:
    """``items`` with the modules of HEAVY_FIRST first, in its order (a stable sort: the order within a module stays)."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    here = Path(__file__).parent

    def weight(item: pytest.Item) -> int:  # a module outside tests/ (a test's own probe session) keeps its place
        return rank.get(item.path.relative_to(here).as_posix(), len(rank)) if item.path.is_relative_to(here) else len(rank)

    items.sort(key=weight)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The declared markers, applied by what a test uses: ``postgres`` where it needs the
    throwaway servers, ``servers`` where it needs any server or Ray (``make quick`` leaves those out),
    ``slow`` where it starts Ray, moto, pip, tpchgen or a subprocess CLI, so ``pytest -m "not slow"``
    is the quicker subset. The heaviest modules first (HEAVY_FIRST)."""
    _weight_order(items)
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if "pg_servers" in used:
            item.add_marker(pytest.mark.postgres)
        if used & _SERVER_FIXTURES:
            item.add_marker(pytest.mark.servers)
        if used & _SLOW_FIXTURES or "cli" in used or "/runtime/test_ray" in str(item.path) or "/integration/" in str(item.path):
            item.add_marker(pytest.mark.slow)

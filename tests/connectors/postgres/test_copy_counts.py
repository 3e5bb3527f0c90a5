"""verify=count on the pass-through: the source's rows are the count its COPY reports, not a second scan.

The pass-through's psql writes the stream into a pipe of its own (``\\g /dev/fd/N``), so its stdout
keeps the COPY's count ("COPY n"); each partition's target COPY count is checked against it inside
the partition's transaction. On the main this started from, the job counted the source before the
load (one more scan of every partition, 0.23 s of TPC-H lineitem SF1's 7.5 s here). What the
source's server ran is read from its statement log, for one role that logs every statement.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from conveyor.core import Counting
from conveyor.errors import TransferError, VerificationError
from tests.helpers import PG_PASSWORD, Relayed, checksum, job, pg_exec

ROWS = 20000


pytestmark = [pytest.mark.usefixtures("pg_password"), pytest.mark.pg_versions]  # on PostgreSQL 15 and 18


@pytest.fixture(scope="module")
def cc_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS cc_src",
            "CREATE TABLE cc_src AS SELECT g AS id, md5(g::text) AS h, 2 AS port FROM generate_series(1, 20000) g",
            "DO $$ BEGIN CREATE ROLE cc_reader LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            f"ALTER ROLE cc_reader PASSWORD '{PG_PASSWORD}'", "ALTER ROLE cc_reader SET log_statement = 'all'",
            "GRANT SELECT ON cc_src TO cc_reader")
    return pg_source


def _logged(server, since: int) -> list[str]:
    """The statements the server logged since byte ``since`` of its log (only cc_reader's are), sent
    by the simple protocol (psql, psycopg, DuckDB) or the extended one (ADBC's driver)."""
    with open(server.root / "log", "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return re.findall(r"LOG:  (?:statement|execute [^:]*): (.*?)(?=\n\S|\Z)", text, re.S)


def _source(server, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "user": "cc_reader", **kw}


def _target(server, table: str, columns: str = "id int, h text, port int") -> dict:
    pg_exec(server, f"DROP TABLE IF EXISTS {table}", f"CREATE TABLE {table} ({columns})", f"INSERT INTO {table} (id) VALUES (-1)")
    return {"type": "postgres", "port": server.port, "table": table}


@pytest.mark.parametrize("mode, strategy, params, degree", [
    ("truncate", "none", {}, 1),                       # one transaction: TRUNCATE, COPY, check, COMMIT
    ("append", "ctid", {"partitions": 3}, 2),          # each partition's own transaction
    ("truncate", "ctid", {"partitions": 3}, 2),        # staged: the stage's rows counted before the swap
])
def test_verify_count_on_the_pass_through_reads_the_source_once(cc_src, pg_target, mode, strategy, params, degree) -> None:
    sink = _target(pg_target, "cc_once")
    since = (cc_src.root / "log").stat().st_size
    report = job(_source(cc_src, table="cc_src"), sink, strategy, params, load_mode=mode, degree=degree)
    logged = [s for s in _logged(cc_src, since) if "cc_src" in s]
    assert len([s for s in logged if s.startswith("COPY (SELECT")]) == len(report.results) == (3 if strategy == "ctid" else 1)
    assert not [s for s in logged if "count(" in s], logged  # the source is not counted apart
    v = report.verification
    assert report.sink_plan.native == "pgcopy-binary" and report.sink_plan.counting == Counting.STREAM
    assert v.ok and v.source_rows == ROWS and sum(r.source_rows for r in report.results) == ROWS
    assert any("its COPY's count" in n for n in v.notes)
    if mode == "append":
        assert pg_exec(pg_target, "SELECT count(*) FROM cc_once") == [(ROWS + 1,)]
    else:
        assert checksum(pg_target, "cc_once") == checksum(cc_src, "cc_src")


def test_a_query_psql_would_rewrite_goes_to_psql_as_is_and_is_counted_in_the_snapshot(cc_src, pg_target) -> None:
    """psql replaces ``:NAME`` in a script with its variable NAME (``:PORT`` with the server's port):
    a query where psql could see one is handed over as a ``-c`` argument, which psql sends as is,
    and its rows are counted in the same snapshot. ``arr[1:PORT]`` reads column port (2 here)."""
    sink = _target(pg_target, "cc_query", "id int, a int[]")
    since = (cc_src.root / "log").stat().st_size
    query = "SELECT id, (ARRAY[10, 20, 30])[1:PORT] AS a FROM cc_src"
    report = job(_source(cc_src, query=query), sink, load_mode="append")
    assert report.sink_plan.native == "pgcopy-binary" and report.verification.source_rows == ROWS
    assert pg_exec(pg_target, "SELECT a, count(*) FROM cc_query WHERE id > 0 GROUP BY a") == [([10, 20], ROWS)]
    reads = [s for s in _logged(cc_src, since) if "cc_src" in s]
    assert any(s.startswith("COPY (") and "[1:PORT]" in s for s in reads)  # as written, not [1:<port>]
    assert any(s.startswith("SELECT count(*)") for s in reads)  # counted apart, for this query only


class _Mute(Relayed):
    """The built-in source, whose streams do not say how many rows they sent."""

    @contextmanager
    def export_native(self, part, columns):  # type: ignore[no-untyped-def]
        with self.inner.export_native(part, columns) as stream:
            yield _Unsaid(stream)


class _Unsaid:
    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.stream, self.rows = stream, None

    def read(self, size: int) -> bytes:
        return self.stream.read(size)


def test_a_stream_that_does_not_say_its_rows_is_rolled_back_not_committed_unchecked(cc_src, pg_target) -> None:
    """A source that offers counts (NativeExport.counts) and then does not give one: the partition
    cannot be checked before its commit, so it is rolled back with an error that says so."""
    from conveyor.config import build_job
    from conveyor.pipelines import run_job

    sink = _target(pg_target, "cc_mute")
    spec = build_job(OmegaConf.create({"source": _source(cc_src, table="cc_src"), "sink": sink, "strategy": {"type": "none"},
                                       "runtime": {"type": "local", "max_retries": 0}, "load_mode": "append"}))
    with pytest.raises(TransferError, match="did not say how many rows it sent") as caught:
        run_job(replace(spec, source=_Mute(spec.source)))
    assert "verify=none" in caught.value.hint
    assert pg_exec(pg_target, "SELECT id FROM cc_mute") == [(-1,)]


def test_rows_the_target_drops_are_caught_against_the_copy_count(cc_src, pg_target) -> None:
    """The check that replaced the count: a BEFORE INSERT trigger returning NULL for some rows makes
    the target's COPY count fall short of the source's; nothing of the partition commits."""
    sink = _target(pg_target, "cc_drop")
    pg_exec(pg_target, "CREATE OR REPLACE FUNCTION cc_drop_some() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN IF NEW.id % 1000 = 7 THEN RETURN NULL; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER cc_drop_some BEFORE INSERT ON cc_drop FOR EACH ROW EXECUTE FUNCTION cc_drop_some()")
    since = (cc_src.root / "log").stat().st_size
    with pytest.raises(VerificationError, match=f"the target stored {ROWS - 20:,} of the {ROWS:,} rows sent to it"):
        job(_source(cc_src, table="cc_src"), sink, load_mode="append")
    assert not any("count(" in s for s in _logged(cc_src, since))
    assert pg_exec(pg_target, "SELECT id FROM cc_drop") == [(-1,)]


def test_a_psql_older_than_12_sends_its_stream_by_its_output_option_and_counts_apart(cc_src, pg_target, monkeypatch) -> None:
    """psql 11 and older write a COPY's data into their stdout whatever ``\\g`` names (the relay would
    wait on the other pipe for ever): for them the stream goes by ``-o`` and the rows are counted in the
    same snapshot. There is no psql 11 here: its version is what is stood in (psql 15 runs both ways)."""
    from conveyor.connectors.postgres import passthrough

    monkeypatch.setattr(passthrough, "_psql_major", lambda: 11)
    sink = _target(pg_target, "cc_old")
    since = (cc_src.root / "log").stat().st_size
    report = job(_source(cc_src, table="cc_src"), sink, load_mode="truncate")
    assert report.sink_plan.native == "pgcopy-binary" and report.verification.source_rows == ROWS
    assert checksum(pg_target, "cc_old") == checksum(cc_src, "cc_src")
    logged = [s for s in _logged(cc_src, since) if "cc_src" in s]
    assert any(s.startswith("SELECT count(*) FROM (SELECT") for s in logged)


def test_a_pass_through_job_asks_psqls_version_while_it_plans_not_on_its_first_partitions_path(cc_src, pg_target, monkeypatch) -> None:
    """The stream's psql script depends on psql's version, and asking starts a psql of its own (~20 ms
    here): the sink asks it in a thread when it agrees on the pass-through, while the job plans, so the
    first partition finds it known. On the main this started from, the first partition asked it, and
    its stream waited."""
    import threading

    from conveyor.connectors.postgres import passthrough

    asked: list[str] = []
    ask = passthrough._ask_psql_major
    monkeypatch.setattr(passthrough, "_VERSION", [])  # as in a new process
    monkeypatch.setattr(passthrough, "_ask_psql_major", lambda: asked.append(threading.current_thread().name) or ask())
    sink = _target(pg_target, "cc_version")
    report = job(_source(cc_src, table="cc_src"), sink, "ctid", {"partitions": 2}, load_mode="append", degree=2)
    assert report.sink_plan.native == "pgcopy-binary" and report.rows == ROWS
    assert asked == ["conveyor-psql-version"]  # once, by the planning's thread; neither partition asked
    assert passthrough._VERSION and passthrough._VERSION[0] >= 12


def _newest_debian_psql() -> str | None:
    """Where Debian's pg_wrapper would run psql from (its newest version's binary), worked out apart
    from the code under test; None where ``psql`` is not the wrapper."""
    import glob
    import os
    import shutil

    found = shutil.which("psql")
    if found is None or os.path.basename(os.path.realpath(found)) != "pg_wrapper":
        return None
    bins = glob.glob("/usr/lib/postgresql/*/bin/psql")
    return max(bins, key=lambda b: [int(x) for x in b.split("/")[4].split(".")]) if bins else None


def test_a_pass_through_partition_runs_the_psql_debians_wrapper_would_run_without_the_wrapper(cc_src, pg_target, monkeypatch) -> None:
    """Debian's ``psql`` is pg_wrapper, a Perl script that took ~20-30 ms of CPU and wall time here
    before the real psql started, on every partition's path (and once more for psql's version). The
    stream's psql is the binary the wrapper would run. On the main this started from, each partition
    ran ``psql`` through the wrapper. Where psql is not the wrapper (no Debian), PATH's psql runs."""
    import os
    import shutil
    import subprocess

    from conveyor.connectors.postgres import passthrough

    started: list[tuple[str, str | None]] = []
    popen = subprocess.Popen

    class Recorded(popen):  # the real Popen, its program and PGSYSCONFDIR noted
        def __init__(self, args, *a, **kw):
            if "-X" in args:  # a stream's psql (not psql --version)
                started.append((args[0], (kw.get("env") or {}).get("PGSYSCONFDIR")))
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(passthrough.subprocess, "Popen", Recorded)
    sink = _target(pg_target, "cc_wrapper")
    report = job(_source(cc_src, table="cc_src"), sink, "ctid", {"partitions": 2}, load_mode="append", degree=2)
    assert report.sink_plan.native == "pgcopy-binary" and report.rows == ROWS
    assert len(started) == 2  # one psql per partition
    expected = _newest_debian_psql()
    for program, sysconf in started:
        if expected is None:
            assert program == shutil.which("psql")
        else:
            assert program == expected and os.path.basename(os.path.realpath(program)) == "psql"
            assert sysconf == os.environ.get("PGSYSCONFDIR", "/etc/postgresql-common")


def test_psql_is_found_behind_debians_wrapper_by_the_wrappers_rule(tmp_path, monkeypatch) -> None:
    """The wrapper runs the newest installed version that has psql, and leaves versions before 13 to
    itself (it preloads readline for them); a psql that is not the wrapper is run as found. A layout
    made in tmp_path stands in for /usr/lib/postgresql and /usr/share/postgresql-common (this machine
    has one version)."""
    import os

    from conveyor.connectors.postgres import passthrough

    common = tmp_path / "share" / "postgresql-common"
    common.mkdir(parents=True)
    (common / "pg_wrapper").write_text("#!/bin/sh\n")
    (common / "pg_wrapper").chmod(0o755)
    path = tmp_path / "bin"
    path.mkdir()
    (path / "psql").symlink_to(common / "pg_wrapper")
    root = tmp_path / "lib"
    for version, has_psql in [("9.6", True), ("13", True), ("15", True), ("16", False)]:
        (root / version / "bin").mkdir(parents=True)
        if has_psql:
            (root / version / "bin" / "psql").write_text("#!/bin/sh\n")
            (root / version / "bin" / "psql").chmod(0o755)
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.delenv("PGSYSCONFDIR", raising=False)
    assert passthrough._find_psql(str(root)) == (str(root / "15" / "bin" / "psql"), {"PGSYSCONFDIR": "/etc/postgresql-common"})
    monkeypatch.setenv("PGSYSCONFDIR", "/etc/mine")
    assert passthrough._find_psql(str(root))[1] == {"PGSYSCONFDIR": "/etc/mine"}
    for version in ("13", "15"):
        os.remove(root / version / "bin" / "psql")
    assert passthrough._find_psql(str(root)) == (str(path / "psql"), {})  # 9.6 only: the wrapper's
    (path / "psql").unlink()
    (path / "psql").write_text("#!/bin/sh\n")  # a psql of its own
    (path / "psql").chmod(0o755)
    assert passthrough._find_psql(str(root)) == (str(path / "psql"), {})
    (path / "psql").unlink()
    assert passthrough._find_psql(str(root)) is None


_NO_PYARROW = """
import sys

class NoPyarrow:  # the job fails at the first import of pyarrow (or of numpy, which it brings)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyarrow", "numpy"):
            raise ImportError(f"{name} imported by a pass-through job")

sys.meta_path.insert(0, NoPyarrow())
from conveyor.cli import entry

sys.argv = ["conveyor", *sys.argv[1:]]
code = entry()
assert "pyarrow" not in sys.modules
sys.exit(code)
"""


@pytest.mark.parametrize("mode", ["truncate", "append"])
def test_a_pass_through_job_never_imports_pyarrow(cc_src, pg_target, tmp_path, mode) -> None:
    """Its rows never become Arrow, so the source's Arrow schema is given deferred (made only if read)
    and the job reads only its columns' names: importing pyarrow (with numpy) was ~0.07 s of the job's
    start here, 5% of TPC-H orders' pg_to_pg. On the main this started from, describe made the schema.
    The columns span the types whose Arrow mapping a job on the Arrow path makes (numeric, dates,
    arrays, an enum)."""
    import subprocess
    import sys

    pg_exec(cc_src, "DROP TABLE IF EXISTS cc_types", "DROP TYPE IF EXISTS cc_mood",
            "CREATE TYPE cc_mood AS ENUM ('sad', 'ok')",
            "CREATE TABLE cc_types AS SELECT g AS id, (g / 7.0)::numeric(12, 2) AS n, g::numeric AS free, "
            "date '2024-01-01' + g AS d, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 min' AS ts, "
            "ARRAY[g, -g] AS arr, (CASE WHEN g % 2 = 0 THEN 'ok' ELSE 'sad' END)::cc_mood AS mood, md5(g::text) AS h "
            "FROM generate_series(1, 5000) g",
            "GRANT SELECT ON cc_types TO cc_reader")
    pg_exec(pg_target, "DROP TABLE IF EXISTS cc_types", "DROP TYPE IF EXISTS cc_mood", "CREATE TYPE cc_mood AS ENUM ('sad', 'ok')",
            "CREATE TABLE cc_types (id int, n numeric(12, 2), free numeric, d date, ts timestamptz, arr int[], mood cc_mood, h text)")
    done = subprocess.run([sys.executable, "-c", _NO_PYARROW, "run", "source=postgres", "sink=postgres", "strategy=ctid", "runtime=local", "--verbose",
                           f"source.port={cc_src.port}", "source.user=cc_reader", "source.table=cc_types", f"sink.port={pg_target.port}",
                           "sink.table=cc_types", f"load_mode={mode}", "degree=2", "strategy.partitions=2", "verify=count",
                           f"hydra.run.dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pass-through" in (tmp_path / "run" / "conveyor.log").read_text()
    assert checksum(pg_target, "cc_types") == checksum(cc_src, "cc_types")


# --- the Arrow path (DuckDB's decoder or ADBC's): the server's scan counts what it sends ------------


def _parquet_rows(path) -> int:  # type: ignore[no-untyped-def]
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in path.rglob("*.parquet"))


@pytest.mark.parametrize("decoder", ["duckdb", "adbc"])
@pytest.mark.parametrize("strategy, params", [("ctid", {"partitions": 3}), ("none", {})])
def test_verify_count_on_the_arrow_path_takes_the_servers_scan_count_not_a_second_scan(cc_src, tmp_path, strategy, params,
                                                                                      decoder) -> None:
    """A PostgreSQL table read through DuckDB's decoder (or ADBC's) into a sink checked after its tasks
    (Parquet): each partition's source count is what the server's scan returned in the read's own
    transaction (pg_stat_get_xact_tuples_returned before and after its COPY, on the decoder's
    connection), not a count(*) of every partition after the load (on the main this started from,
    0.32-0.43 s of the verify phase of postgres_to_parquet on TPC-H lineitem SF1, and ~0.9 CPU-s of its
    source)."""
    since = (cc_src.root / "log").stat().st_size
    out = tmp_path / "out"
    report = job(_source(cc_src, table="cc_src", decoder=decoder), {"type": "parquet", "path": str(out)}, strategy, params,
                 load_mode="replace", batch_size=5000)
    assert report.plan.info.reader.startswith(f"Arrow batches decoded by {'DuckDB' if decoder == 'duckdb' else 'ADBC'}")
    logged = [s for s in _logged(cc_src, since) if "cc_src" in s or "tuples_returned" in s]
    scans = [s for s in logged if "tuples_returned(" in s and "to_regprocedure" not in s]  # DuckDB sends these as COPYs too
    copies = [s for s in logged if s.startswith("COPY (SELECT") and s not in scans]
    assert len(copies) == len(report.results) == (3 if strategy == "ctid" else 1)
    assert not [s for s in logged if "count(" in s], logged  # the source is not counted apart
    assert len(scans) == 2 * len(report.results)
    v = report.verification
    assert v.ok and v.source_rows == ROWS == _parquet_rows(out) and sum(r.source_rows for r in report.results) == ROWS
    assert any("the rows its scan of each partition returned" in n for n in v.notes) and not any("again" in n for n in v.notes)


def test_a_scan_count_that_is_not_the_partitions_rows_is_counted_again_not_failed(pg_source, tmp_path) -> None:
    """Where the server's scan returns rows the query then drops (TID range scans switched off: each
    page range is a sequential scan of the whole table with the range as a filter), its count is not
    the partition's: those partitions are counted at the source, in the job's snapshot, and the run
    is verified by that count."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS cc_seq", "CREATE TABLE cc_seq AS SELECT g AS id, md5(g::text) AS h FROM generate_series(1, 20000) g")
    report = job({"type": "postgres", "port": pg_source.port, "table": "cc_seq", "options": {"options": "-c enable_tidscan=off"}},
                 {"type": "parquet", "path": str(tmp_path / "out")}, "ctid", {"partitions": 3}, load_mode="replace")
    v = report.verification
    assert report.plan.info.reader.startswith("Arrow batches decoded by DuckDB")
    assert v.ok and v.source_rows == ROWS == _parquet_rows(tmp_path / "out")
    assert [r.source_rows for r in report.results] == [ROWS] * 3  # each scan returned the whole table
    assert any("counted again where that was not the rows written: ctid-00000, ctid-00001, ctid-00002" in n for n in v.notes), v.notes


def _lose_a_batch(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """DuckDB's decoder made to lose the second partition's last batch, after the real read (the
    server's scan count is taken as usual): a decoder that drops rows."""
    from conveyor.connectors.postgres import reading

    real = reading.read_duckdb

    def lossy(src, part, sent):  # type: ignore[no-untyped-def]
        batches = list(real(src, part, sent))
        yield from (batches[:-1] if part.index == 1 else batches)

    monkeypatch.setattr(reading, "read_duckdb", lossy)


def test_rows_the_decoder_loses_are_caught_against_the_servers_scan_count(cc_src, tmp_path, monkeypatch) -> None:
    """The scan's count is the server's, not the decoder's: a decoder that loses a batch (stood in
    for by dropping the second partition's last batch after the read) writes fewer rows than the
    server sent, the partition is counted again at the source, and the run fails naming it."""
    _lose_a_batch(monkeypatch)
    with pytest.raises(VerificationError, match=r"ctid-00001: source [\d,]+ rows, written [\d,]+") as caught:
        job(_source(cc_src, table="cc_src"), {"type": "parquet", "path": str(tmp_path / "out")}, "ctid", {"partitions": 3},
            load_mode="replace", batch_size=2000)
    assert "ctid-00000" not in str(caught.value) and not list((tmp_path / "out").rglob("*.parquet"))


def test_a_server_that_does_not_count_scans_is_counted_as_before(pg_source, tmp_path) -> None:
    """Where the server keeps no scan counts (track_counts off; a server that speaks PostgreSQL's
    protocol may lack pg_stat_get_xact_tuples_returned altogether), describe sees it and the reads do
    not ask: the partitions are counted at the source after the load, as before."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS cc_nostat", "CREATE TABLE cc_nostat AS SELECT g AS id FROM generate_series(1, 20000) g")
    report = job({"type": "postgres", "port": pg_source.port, "table": "cc_nostat", "options": {"options": "-c track_counts=off"}},
                 {"type": "parquet", "path": str(tmp_path / "out")}, "ctid", {"partitions": 3}, load_mode="replace")
    v = report.verification
    assert v.ok and v.source_rows == ROWS == _parquet_rows(tmp_path / "out")
    assert [r.source_rows for r in report.results] == [None] * 3 and not any("scan" in n for n in v.notes), v.notes


# --- sinks that check each partition before its commit, on the Arrow path ------------------------


def _checked_target(kind: str, pg_target, tmp_path, mysql_server=None) -> tuple[dict, callable]:
    """A target whose sink checks each partition's rows before its commit, holding one row already;
    and how many rows it holds."""
    if kind == "postgres":
        pg_exec(pg_target, "DROP TABLE IF EXISTS cc_checked", "CREATE TABLE cc_checked (id int, h text, port int)",
                "INSERT INTO cc_checked (id) VALUES (-1)")
        return ({"type": "postgres", "port": pg_target.port, "table": "cc_checked", "copy_path": "arrow"},
                lambda: pg_exec(pg_target, "SELECT count(*) FROM cc_checked")[0][0])
    if kind == "duckdb":
        import duckdb

        db = tmp_path / "checked.duckdb"
        with duckdb.connect(str(db)) as con:
            con.execute("CREATE TABLE cc_checked (id INTEGER, h VARCHAR, port INTEGER); INSERT INTO cc_checked (id) VALUES (-1)")

        def rows() -> int:
            with duckdb.connect(str(db), read_only=True) as con:
                return con.execute("SELECT count(*) FROM cc_checked").fetchone()[0]
        return {"type": "duckdb", "database": str(db), "table": "cc_checked"}, rows
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS cc_checked", "CREATE TABLE cc_checked (id int, h text, port int)", "INSERT INTO cc_checked (id) VALUES (-1)")
    return ({"type": "mysql", "port": m.port, "user": m.user, "database": m.database, "table": "cc_checked"},
            lambda: m.execute("SELECT count(*) FROM cc_checked")[0][0])


@pytest.mark.parametrize("kind, mode, strategy, params", [
    ("postgres", "append", "ctid", {"partitions": 3}),     # each partition's own transaction
    ("postgres", "truncate", "none", {}),                  # one transaction: TRUNCATE, COPY, check, COMMIT
    ("duckdb", "append", "ctid", {"partitions": 3}),
    ("mysql", "append", "ctid", {"partitions": 3}),
])
def test_a_sink_checking_before_its_commit_takes_the_reads_scan_count_not_a_count_before_the_load(
        cc_src, pg_target, tmp_path, request, kind, mode, strategy, params) -> None:
    """A sink whose commits are final (an append into PostgreSQL, DuckDB or MySQL, PostgreSQL's truncate in
    one transaction) checks each partition's rows before its COMMIT. On the main this started from the job
    counted every partition at the source before the tasks for it (a count(*) over the whole source: the
    "count source" phase); each partition's check now takes the rows its read's server said its scan
    returned (the same count verify=count takes into Parquet), so the source is read once."""
    sink, held = _checked_target(kind, pg_target, tmp_path, request.getfixturevalue("mysql_server") if kind == "mysql" else None)
    since = (cc_src.root / "log").stat().st_size
    report = job(_source(cc_src, table="cc_src"), sink, strategy, params, load_mode=mode, degree=2, batch_size=5000)
    logged = [s for s in _logged(cc_src, since) if "cc_src" in s]
    assert not report.sink_plan.native and report.sink_plan.checks_before_commit and report.sink_plan.counting == Counting.READ
    assert not [s for s in logged if "count(" in s], logged  # the source is not counted apart
    assert "count source" not in report.phases, report.phases
    v = report.verification
    assert v.ok and v.source_rows == ROWS and [r.source_rows for r in report.results] == [r.rows for r in report.results]
    assert any("checked against the source's before each commit" in n for n in v.notes), v.notes
    assert held() == ROWS + (1 if mode == "append" else 0)


def test_a_scan_count_that_is_not_the_partitions_rows_is_counted_before_the_commit_not_failed(pg_source, pg_target) -> None:
    """TID range scans off: each page range's scan returns the whole table, so the read's count is not
    the partition's rows; the sink then counts the partition at the source (in the job's snapshot,
    inside its transaction, before its COMMIT) and that count decides: the run commits every partition."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS cc_seq2", "CREATE TABLE cc_seq2 AS SELECT g AS id, md5(g::text) AS h, 2 AS port FROM generate_series(1, 20000) g")
    sink = _target(pg_target, "cc_seq2_t")
    report = job({"type": "postgres", "port": pg_source.port, "table": "cc_seq2", "options": {"options": "-c enable_tidscan=off"}},
                 {**sink, "copy_path": "arrow"}, "ctid", {"partitions": 3}, load_mode="append")
    assert report.sink_plan.counting == Counting.READ and report.verification.ok and report.verification.source_rows == ROWS
    assert [r.source_rows for r in report.results] == [r.rows for r in report.results] and all(r.rows < ROWS for r in report.results)
    assert pg_exec(pg_target, "SELECT count(*) FROM cc_seq2_t") == [(ROWS + 1,)]


def test_rows_the_decoder_loses_are_rolled_back_before_the_commit(cc_src, pg_target, monkeypatch) -> None:
    """A decoder that loses a batch (stood in for by dropping the second partition's last batch after
    the real read) writes fewer rows than the server's scan returned: that partition is counted at the
    source before its commit, the counts differ, it is rolled back and the run fails naming it; the
    partition committed before it stays whole, and the message says so."""
    _lose_a_batch(monkeypatch)
    sink = _target(pg_target, "cc_lossy")
    with pytest.raises(VerificationError, match=r"partition ctid-00001: source ([\d,]+) rows, written [\d,]+: rolled back") as caught:
        job(_source(cc_src, table="cc_src"), {**sink, "copy_path": "arrow"}, "ctid", {"partitions": 3}, load_mode="append", batch_size=2000)
    said = re.search(r"1 of 3 partitions had committed: their ([\d,]+) rows stay in the target", str(caught.value))
    assert said, str(caught.value)  # the run stopped starting partitions at the failure: ctid-00000 committed whole
    assert pg_exec(pg_target, "SELECT count(*) FROM cc_lossy") == [(1 + int(said.group(1).replace(",", "")),)]

"""Sync jobs on the target shapes and operations careful users have: foreign keys between the synced
tables (cascading, NO ACTION, deferred) and audit triggers on the target, a target whose own
foreign key action would change rows the source did not, two runs of one job at once and two jobs
whose slot names end alike, a source table dropped and created again, a replica identity changed on
the source, a source transaction that holds the run's snapshot back, and ``follow`` from the first
run. Real servers throughout: the source runs with wal_level=logical, every target is compared with
its source (count and a checksum of every row)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import BIN, checksum, pg_exec, run_cli, wait_until


@pytest.fixture
def src(pg_source, pg_target):
    yield pg_source
    # a stopped run's walsender can hold its slot a moment after the process is gone: wait (bounded) until none is active
    wait_until(lambda: not pg_exec(pg_source, "SELECT 1 FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND active"),
               "the slots to be released", 30)
    pg_exec(pg_source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND NOT active")
    for (pub,) in pg_exec(pg_source, "SELECT pubname FROM pg_publication WHERE pubname LIKE 'conveyor%'"):
        pg_exec(pg_source, f'DROP PUBLICATION "{pub}"')
    pg_exec(pg_target, "DROP TABLE IF EXISTS _conveyor_sync")  # the targets' state goes with the slots


def _sync(tmp_path: Path, args: list[str], name: str) -> dict:
    report = tmp_path / f"{name}.json"
    r = run_cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/{name}", timeout=300)
    assert r.code == 0, r.err
    return json.loads(report.read_text())


def _family(src, tmp, action: str = "ON DELETE CASCADE") -> None:
    """parent (100 rows) and child (5,000 rows, 50 a parent) at the source, the child's key referring to the parent."""
    pg_exec(src, f"DROP TABLE IF EXISTS {tmp}_child", f"DROP TABLE IF EXISTS {tmp}_parent",
            f"CREATE TABLE {tmp}_parent (id int PRIMARY KEY, name text)",
            f"CREATE TABLE {tmp}_child (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES {tmp}_parent (id) {action}, v text)",
            f"INSERT INTO {tmp}_parent SELECT g, 'p' || g FROM generate_series(1, 100) g",
            f"INSERT INTO {tmp}_child SELECT g, 1 + g % 100, 'c' || g FROM generate_series(1, 5000) g")


def _family_args(src, dst, tmp: str, *more: str) -> list[str]:
    return ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", f"source.tables=[{tmp}_parent,{tmp}_child]",
            f"sink.port={dst.port}", "load_mode=create", "sink.foreign_keys=true", "incremental.method=replication", "strategy=none", *more]


def _family_changes(src, tmp: str) -> None:
    """Every kind of change a family of tables sees: parents renamed, a parent with its children deleted, a new parent
    with new children, children moved from a parent that is then deleted to a new one."""
    pg_exec(src, f"UPDATE {tmp}_parent SET name = name || ' renamed'",
            f"DELETE FROM {tmp}_child WHERE parent_id = 7", f"DELETE FROM {tmp}_parent WHERE id = 7",
            f"INSERT INTO {tmp}_parent VALUES (1000, 'new')", f"INSERT INTO {tmp}_child SELECT g, 1000, 'n' FROM generate_series(9000, 9010) g",
            f"INSERT INTO {tmp}_parent VALUES (2000, 'moved to')",
            f"UPDATE {tmp}_child SET parent_id = 2000 WHERE parent_id = 8", f"DELETE FROM {tmp}_parent WHERE id = 8")


@pytest.mark.parametrize("action", ["ON DELETE CASCADE", "", "DEFERRABLE INITIALLY DEFERRED"])
def test_foreign_keys_between_synced_tables_keep_every_child_row(src, pg_target, tmp_path: Path, action: str) -> None:
    """Conveyor's own create carries the foreign key into the target; an UPDATE of every parent arrives as an UPDATE
    (a cascade fires for no row the source kept), inserts parent first and deletes child first (NO ACTION accepts them)."""
    tmp = "fk" + str(abs(hash(action)) % 1000)
    pg_exec(pg_target, f"DROP TABLE IF EXISTS {tmp}_child", f"DROP TABLE IF EXISTS {tmp}_parent")
    _family(src, tmp, action)
    args = _family_args(src, pg_target, tmp)
    _sync(tmp_path, args, "first")
    fks = pg_exec(pg_target, f"SELECT confdeltype, condeferrable FROM pg_constraint WHERE conrelid = '{tmp}_child'::regclass AND contype = 'f'")
    assert fks == [({"ON DELETE CASCADE": "c", "": "a"}.get(action, "a"), action.startswith("DEFERRABLE"))]
    _family_changes(src, tmp)
    done = _sync(tmp_path, args, "changes")
    for table in ("parent", "child"):
        assert checksum(pg_target, f"{tmp}_{table}") == checksum(src, f"{tmp}_{table}")
    assert pg_exec(pg_target, f"SELECT count(*) FROM {tmp}_child") == [(5000 - 50 + 11,)]
    tables = done["sync"]["runs"][0]["tables"]
    assert tables[f"public.{tmp}_parent"]["deleted"] == 2 and tables[f"public.{tmp}_child"]["deleted"] == 50


def test_an_audit_trigger_on_the_target_sees_the_sources_updates_as_updates(src, pg_target, tmp_path: Path) -> None:
    pg_exec(src, "DROP TABLE IF EXISTS au_t", "CREATE TABLE au_t (id int PRIMARY KEY, v text)",
            "INSERT INTO au_t SELECT g, 'v' || g FROM generate_series(1, 1000) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS au_t", "DROP TABLE IF EXISTS au_log", "CREATE TABLE au_log (op text, id int)")
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=au_t", f"sink.port={pg_target.port}",
            "sink.table=au_t", "load_mode=create", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    pg_exec(pg_target, "CREATE OR REPLACE FUNCTION au_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                       "INSERT INTO au_log VALUES (TG_OP, coalesce(NEW.id, OLD.id)); RETURN NULL; END $$",
            "CREATE TRIGGER au_audit AFTER INSERT OR UPDATE OR DELETE ON au_t FOR EACH ROW EXECUTE FUNCTION au_audit()")
    pg_exec(src, "UPDATE au_t SET v = v || 'u' WHERE id <= 10", "UPDATE au_t SET v = v WHERE id = 11",  # one no-op update
            "DELETE FROM au_t WHERE id = 20", "INSERT INTO au_t VALUES (5000, 'new')")
    _sync(tmp_path, args, "changes")
    assert checksum(pg_target, "au_t") == checksum(src, "au_t")
    assert sorted(pg_exec(pg_target, "SELECT op, id FROM au_log")) == sorted(
        [("UPDATE", i) for i in range(1, 12)] + [("DELETE", 20), ("INSERT", 5000)])


def test_a_target_foreign_key_action_the_source_lacks_is_refused_by_name(src, pg_target, tmp_path: Path) -> None:
    """The source's tables have no foreign key; the target's child cascades the parent's deletes: a parent deleted at the
    source (its children kept there) would delete child rows the source still holds. Refused by name, the targets kept."""
    tmp = "fkx"
    pg_exec(pg_target, f"DROP TABLE IF EXISTS {tmp}_child", f"DROP TABLE IF EXISTS {tmp}_parent")
    pg_exec(src, f"DROP TABLE IF EXISTS {tmp}_child", f"DROP TABLE IF EXISTS {tmp}_parent",
            f"CREATE TABLE {tmp}_parent (id int PRIMARY KEY, name text)", f"CREATE TABLE {tmp}_child (id int PRIMARY KEY, parent_id int, v text)",
            f"INSERT INTO {tmp}_parent SELECT g, 'p' || g FROM generate_series(1, 100) g",
            f"INSERT INTO {tmp}_child SELECT g, 1 + g % 100, 'c' || g FROM generate_series(1, 5000) g")
    args = _family_args(src, pg_target, tmp)
    _sync(tmp_path, args, "first")
    pg_exec(pg_target, f"ALTER TABLE {tmp}_child ADD FOREIGN KEY (parent_id) REFERENCES {tmp}_parent (id) ON DELETE CASCADE")
    pg_exec(src, f"DELETE FROM {tmp}_parent WHERE id = 3", f"UPDATE {tmp}_child SET v = 'x' WHERE id = 1")
    before = checksum(pg_target, f"{tmp}_child"), checksum(pg_target, f"{tmp}_parent")
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/cascade")
    assert r.code == 6 and "Traceback" not in r.err, r.err
    assert (f"verification failed for public.{tmp}_child: the changes insert 0, update 1 and delete 0 rows of it, and 0 were inserted, "
            "1 updated and 50 deleted (a trigger, rule or foreign key action of the target changed rows the source did not)") in r.err
    assert (checksum(pg_target, f"{tmp}_child"), checksum(pg_target, f"{tmp}_parent")) == before


def _follow(args: list[str], tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    report = tmp_path / f"{name}.json"
    proc = subprocess.Popen([str(BIN / "conveyor"), "--report", str(report), *args, f"hydra.run.dir={tmp_path}/{name}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, report


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


def _ids_table(server, name: str, rows: int = 2000) -> None:
    pg_exec(server, f"DROP TABLE IF EXISTS {name}", f"CREATE TABLE {name} (id int PRIMARY KEY, v text)",
            f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, {rows}) g")


def _writes(server, name: str, rounds: int, base: int) -> None:
    for i in range(rounds):  # bounded
        pg_exec(server, f"UPDATE {name} SET v = v || 'w' WHERE id % 50 = {i % 50}", f"DELETE FROM {name} WHERE id = {base + i}",
                f"INSERT INTO {name} VALUES ({100000 + base + i}, 'n')")


def test_two_runs_of_one_job_at_once_one_is_refused_and_the_target_stays_exact(src, pg_target, tmp_path: Path) -> None:
    _ids_table(src, "cc_t")
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=cc_t", f"sink.port={pg_target.port}",
            "sink.table=cc_t", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    proc, report = _follow([*args, "incremental.follow=0.2"], tmp_path, "follow")
    try:
        wait_until(lambda: report.exists() and json.loads(report.read_text())["sync"]["runs"], "a first apply of the follow", 60)
        _writes(src, "cc_t", 20, 1)
        plan = run_cli("plan", *args[1:], f"hydra.run.dir={tmp_path}/plan")  # a plan reads beside a running sync
        assert plan.code == 0 and "bytes of WAL on the source" in plan.out, plan.err
        dropped = run_cli("clean", "--drop", *args[1:])  # a drop is refused while it runs
        assert dropped.code == 1 and "another run of this job is running" in dropped.err, dropped.err
        second = run_cli(*args, f"hydra.run.dir={tmp_path}/second")
        assert second.code == 1 and "Traceback" not in second.err
        assert second.error_lines[0].startswith("error: sync: another run of this job is running (source backend pid "), second.err
        assert "one run of a sync job applies at a time" in second.error_lines[0]
        wait_until(lambda: checksum(pg_target, "cc_t") == checksum(src, "cc_t"), "the follow to apply the writes", 60)
    finally:
        err = _stop(proc)
    assert proc.returncode == 130, err
    _writes(src, "cc_t", 5, 40)
    _sync(tmp_path, args, "last")
    assert checksum(pg_target, "cc_t") == checksum(src, "cc_t")


def test_two_jobs_whose_slot_names_end_alike_sync_into_one_schema_exactly(src, pg_target, tmp_path: Path) -> None:
    """Two jobs at once (each following), their slots sharing the last 20 characters, into two tables of one target schema."""
    procs = []
    try:
        for name in ("sa_t", "sb_t"):
            _ids_table(src, name)
            args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", f"source.table={name}",
                    f"sink.port={pg_target.port}", f"sink.table={name}", "load_mode=replace", "incremental.method=replication",
                    "strategy=none", f"incremental.slot=conveyor_{name[:2]}_shared_slot_tail"]
            _sync(tmp_path, args, f"first_{name}")
            procs.append(_follow([*args, "incremental.follow=0.2"], tmp_path, f"follow_{name}"))
        for _, report in procs:
            wait_until(lambda report=report: report.exists() and json.loads(report.read_text())["sync"]["runs"], "a follow's first apply", 60)
        writers = [threading.Thread(target=_writes, args=(src, name, 30, 1)) for name in ("sa_t", "sb_t")]
        for w in writers:
            w.start()
        for w in writers:
            w.join(timeout=120)
        for name in ("sa_t", "sb_t"):
            wait_until(lambda name=name: checksum(pg_target, name) == checksum(src, name), f"{name} applied", 60)
    finally:
        for proc, _ in procs:
            _stop(proc)
    assert [p.returncode for p, _ in procs] == [130, 130]


def test_a_source_table_dropped_and_created_again_is_refused_by_name(src, pg_target, tmp_path: Path) -> None:
    _ids_table(src, "rc_t", 100)
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=rc_t", f"sink.port={pg_target.port}",
            "sink.table=rc_t", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    _ids_table(src, "rc_t", 150)  # the same name and columns, another table
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/recreated")
    assert r.code == 4 and "Traceback" not in r.err, r.err
    assert r.error_lines == ["error: sync of public.rc_t stopped: the source table is not in the job's publication "
                             f"{_slot(pg_target, 'rc_t')} (it was dropped and created again, or taken out of the publication): its changes since "
                             "are not decoded"], r.err
    assert "hint: conveyor clean --drop (this job's settings), then run it again" in r.err
    assert run_cli("clean", "--drop", *args[1:]).code == 0
    _sync(tmp_path, args, "reloaded")
    assert checksum(pg_target, "rc_t") == checksum(src, "rc_t")


def _slot(target, table: str) -> str:
    """The slot of the job into ``table``, as its sync state beside the target names it."""
    (slot,), = pg_exec(target, f"SELECT slot FROM _conveyor_sync WHERE target = 'public.{table}'")
    return slot


def test_a_replica_identity_changed_on_the_source_keeps_it_writable_and_the_sync_exact(src, pg_target, tmp_path: Path) -> None:
    _ids_table(src, "ri_t", 1000)
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=ri_t", f"sink.port={pg_target.port}",
            "sink.table=ri_t", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    pg_exec(src, "ALTER TABLE ri_t REPLICA IDENTITY FULL")
    # the source's own writes: refused by PostgreSQL if the job's publication left out a column the identity needs
    pg_exec(src, "UPDATE ri_t SET v = 'full' || id WHERE id <= 10", "DELETE FROM ri_t WHERE id BETWEEN 11 AND 20", "UPDATE ri_t SET id = -1 WHERE id = 30")
    _sync(tmp_path, args, "full")
    assert checksum(pg_target, "ri_t") == checksum(src, "ri_t")
    pg_exec(src, "ALTER TABLE ri_t ALTER COLUMN v SET NOT NULL", "CREATE UNIQUE INDEX ri_v ON ri_t (v)", "ALTER TABLE ri_t REPLICA IDENTITY USING INDEX ri_v")
    pg_exec(src, "UPDATE ri_t SET v = 'again' WHERE id = 500")
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/index")
    assert r.code == 2 and r.error_lines == ["error: incremental.method=replication: public.ri_t has REPLICA IDENTITY USING INDEX: its "
                                             "deletes would not carry the primary key"], r.err
    pg_exec(src, "ALTER TABLE ri_t REPLICA IDENTITY DEFAULT", "DROP INDEX ri_v")
    # the update made under USING INDEX carried the index's column as its old key, not the primary key: refused by name
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/default")
    assert r.code == 4 and r.error_lines == ["error: sync of public.ri_t: 1 changes do not carry their key (a key value stored out of "
                                             "line, or changes made while the table's REPLICA IDENTITY did not hold its primary key)"], r.err
    assert run_cli("clean", "--drop", *args[1:]).code == 0
    _sync(tmp_path, args, "reloaded")
    pg_exec(src, "UPDATE ri_t SET v = 'default' WHERE id = 501", "DELETE FROM ri_t WHERE id = 502")
    _sync(tmp_path, args, "default")
    assert checksum(pg_target, "ri_t") == checksum(src, "ri_t")


def test_a_source_transaction_holding_the_snapshot_back_is_said_and_times_out(src, pg_target, tmp_path: Path) -> None:
    import psycopg

    _ids_table(src, "hx_t", 100)
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=hx_t", f"sink.port={pg_target.port}",
            "sink.table=hx_t", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    with psycopg.connect(src.dsn()) as held:
        held.execute("INSERT INTO hx_t VALUES (-5, 'held')")  # holds an xid until it ends
        pid = held.info.backend_pid
        r = run_cli(*args, "incremental.wait_timeout=3", f"hydra.run.dir={tmp_path}/timeout")
        assert r.code == 1 and "Traceback" not in r.err, r.err
        assert f"(pid {pid}, open " in r.err and "sync: waiting for source transaction " in r.err, r.err
        assert r.error_lines[0].endswith("stayed open past incremental.wait_timeout=3 s; a replication slot's snapshot begins once every "
                                         "transaction running when it is made has ended"), r.err
        assert pg_exec(src, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%'") == [(0,)]
        threading.Timer(12, held.commit).start()  # past the CLI's start-up (over 3 s on a slow machine) and its first wait line
        first = run_cli("--report", str(tmp_path / "waited.json"), *args, f"hydra.run.dir={tmp_path}/waited", timeout=120)
    assert first.code == 0 and f"(pid {pid}, open " in first.err, first.err
    assert checksum(pg_target, "hx_t") == checksum(src, "hx_t")


def test_follow_follows_from_the_first_run(src, pg_target, tmp_path: Path) -> None:
    _ids_table(src, "fw_t", 500)
    pg_exec(pg_target, "DROP TABLE IF EXISTS fw_t")
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=fw_t", f"sink.port={pg_target.port}",
            "sink.table=fw_t", "load_mode=replace", "incremental.method=replication", "strategy=none", "incremental.follow=0.2"]
    proc, report = _follow(args, tmp_path, "follow")
    try:
        wait_until(lambda: report.exists() and "first_load" in json.loads(report.read_text())["sync"], "the first load", 60)
        time.sleep(0.5)
        assert proc.poll() is None  # still running: following
        _writes(src, "fw_t", 10, 1)
        wait_until(lambda: checksum(pg_target, "fw_t") == checksum(src, "fw_t"), "the follow to apply the writes", 60)
    finally:
        err = _stop(proc)
    assert proc.returncode == 130 and "changes applied up to" in err, err


def test_a_lost_slot_is_refused_by_name_not_reloaded_in_silence(src, pg_target, tmp_path: Path) -> None:
    _ids_table(src, "ls_t", 100)
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=ls_t", f"sink.port={pg_target.port}",
            "sink.table=ls_t", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    pg_exec(src, f"SELECT pg_drop_replication_slot('{_slot(pg_target, 'ls_t')}')")
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/lost")
    assert r.code == 1 and "Traceback" not in r.err, r.err
    assert r.error_lines[0].endswith("and the source has no such slot (dropped, or the source is another server): the changes since "
                                     "the target's position are lost to it"), r.err
    assert "hint: conveyor clean --drop (this job's settings), then run it again" in r.err
    assert run_cli("clean", "--drop", *args[1:]).code == 0
    _sync(tmp_path, args, "reloaded")
    assert checksum(pg_target, "ls_t") == checksum(src, "ls_t")

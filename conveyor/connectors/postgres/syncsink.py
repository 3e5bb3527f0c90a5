"""The PostgreSQL sink's side of a sync job: :class:`~conveyor.kit.syncapply.SqlChangeApplier` in PostgreSQL's spelling."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from conveyor.connectors.postgres.common import SCRATCH_STORAGE, connect, ident
from conveyor.kit.syncapply import PRESENT, SqlChangeApplier


class PgChangeApplier(SqlChangeApplier):
    config: Any
    _overriding = "OVERRIDING SYSTEM VALUE "
    # a key rewritten as an equal value (numeric 1.0 as 1.00, a nondeterministic collation's 'A' as 'a') arrives as the source
    # holds it; a key whose bytes did not change leaves a HOT update possible, and foreign key actions fire only on changed bytes
    _sets_keys = True
    #: the stage is made empty for each run (:meth:`sync_stage`): each partition's COPY goes straight into it, committed with
    #: its marker (a truncate load would stage every partition again and move the rows over once all were in)
    stage_load_mode = "append"

    @contextlib.contextmanager
    def _sync_connection(self) -> Iterator[Any]:
        con = connect(self.config, autocommit=True)  # BEGIN / COMMIT are the applier's
        try:
            yield con
        finally:
            con.close()

    def _quote(self, name: str) -> str:
        return ident(name)

    @property
    def _sync_target(self) -> str:
        return f"{self.config.schema}.{self.config.table}"

    def _stage_sql(self, stage: str) -> list[str]:
        q = self._qualified(stage)
        return [f"DROP TABLE IF EXISTS {q}",
                f"CREATE UNLOGGED TABLE {q}{SCRATCH_STORAGE} AS SELECT *, NULL::boolean AS {ident(PRESENT)} FROM {self._qualified()} "
                "WITH NO DATA"]

    def _row_differs(self, columns: Sequence[str], quote: Callable[[str], str]) -> str:
        # each column's text output, once per row (a NULL and an empty string print apart: "" is quoted)
        if not columns:
            return ""
        return (f"ROW({', '.join(f't.{quote(c)}' for c in columns)})::text IS DISTINCT FROM "
                f"ROW({', '.join(f's.{quote(c)}' for c in columns)})::text")

    def _planned(self, con: Any, keys: Sequence[str]) -> list[str]:
        indexed = con.execute("SELECT 1 FROM pg_index i WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indnkeyatts = %s AND "
                              "(SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a WHERE a.attrelid = i.indrelid "
                              "AND a.attnum = ANY(i.indkey)) = %s", (self._qualified(), len(keys), sorted(keys))).fetchone()
        if not indexed:
            return []
        return ["SET LOCAL enable_hashjoin = off", "SET LOCAL enable_mergejoin = off", "SET LOCAL jit = off"]

    def drop_stage(self, stage: str) -> None:
        from conveyor.connectors.postgres import commits

        with self._sync_connection() as con:
            con.execute(f"DROP TABLE IF EXISTS {self._qualified(stage)}")
            if con.execute("SELECT to_regclass(%s) IS NOT NULL", (self._qualified(commits.MARKERS),)).fetchone()[0]:
                # the stage load's commit markers: the stage is gone, and a run's stage load is never resumed
                con.execute(f"DELETE FROM {self._qualified(commits.MARKERS)} WHERE target LIKE %s", (f"%{stage}%",))

    def _unwritable(self, con: Any) -> set[str]:
        from conveyor.connectors.postgres.target import always_identity

        return always_identity(con, self._qualified())

    def _computed(self, con: Any) -> set[str]:
        return {r[0] for r in con.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND "
                                          "attgenerated <> '' AND NOT attisdropped", (self._qualified(),)).fetchall()}

    def _state_missing(self, con: Any) -> bool:
        from conveyor.kit.syncapply import STATE

        return con.execute("SELECT to_regclass(%s) IS NULL", (self._qualified(STATE),)).fetchone()[0]

    def _deferred(self) -> list[str]:
        if self.config.apply_as_replica:
            return ["SET LOCAL session_replication_role = replica"]
        return ["SET CONSTRAINTS ALL DEFERRED"]

    def _effects(self, con: Any) -> tuple[int, int, int] | None:
        # this transaction's own counts (pg_stat_xact_*: triggers' and foreign key actions' rows included), over the leaves of a
        # partitioned target
        row = con.execute("SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_del), 0) "
                          "FROM pg_stat_xact_user_tables WHERE relid = %s::regclass OR relid IN (SELECT relid FROM pg_partition_tree(%s::regclass))",
                          (self._qualified(), self._qualified())).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def _reads_back(self, con: Any) -> bool:
        # a trigger or rule of the target (or of a partition of it) could skip or change a row: read them back; without, an
        # UPDATE ... SET c = s.c from a stage made from the target's own columns stores the staged values, and
        # pg_stat_xact (_effects) says how many rows the transaction inserted, updated and deleted
        return bool(con.execute(
            "SELECT EXISTS (SELECT FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN (SELECT %s::regclass UNION "
            "SELECT relid FROM pg_partition_tree(%s::regclass))) OR EXISTS (SELECT FROM pg_rewrite WHERE rulename <> '_RETURN' "
            "AND ev_class IN (SELECT %s::regclass UNION SELECT relid FROM pg_partition_tree(%s::regclass)))",
            (self._qualified(),) * 4).fetchone()[0])

"""ADBC sink: ``adbc_ingest``, one transaction per partition; staged modes swap a staging table in
with standard SQL at the end."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from conveyor.connectors.adbc.common import AdbcBase, AdbcSinkConfig, qident
from conveyor.core import JobOptions, Partition, PrepareRequest, SinkCapabilities, SinkPlan, TargetInfo, WriteStats, check_stored
from conveyor.errors import ConveyorError, SchemaError
from conveyor.kit.arrowutil import CountingBatches, length_checked
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.staged import StagedSink, check_mode, staged_path


class AdbcSink(AdbcBase, StagedSink):
    """Writes through ``adbc_ingest``; load modes beyond append need the driver to run SQL."""

    config_class = AdbcSinkConfig
    capabilities = SinkCapabilities(read_back=True)

    def __init__(self, config: AdbcSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.table = config.table

    def _name(self, table: str | None = None) -> str:
        t = qident(table or self.config.table)
        return f"{qident(self.config.db_schema)}.{t}" if self.config.db_schema else t

    def _target_columns(self) -> list[TargetColumn] | None:
        conn = self._connect()
        try:
            try:
                schema = conn.adbc_get_table_schema(self.config.table, db_schema_filter=self.config.db_schema)
            except Exception:
                return None
            self._target_schema = schema
            return [TargetColumn(f.name, str(f.type), True, False) for f in schema]
        finally:
            conn.close()

    def _ingest(self, table: str, data: Any, mode: str, partition: str | None = None, sent: Callable[[], int] | None = None) -> int | None:
        """``data`` into ``table`` in one transaction. With ``sent`` (the rows it was given, once read):
        the rows the target stored, counted in that transaction before and after (a driver's ingest
        returns what it sent, and a trigger can drop rows), must be those rows before it commits."""
        conn = self._connect(partition)
        cur = conn.cursor()

        def count() -> int:
            # SQLite: the rows this connection (opened for the partition) inserted; a count before the ingest
            # would hold a read lock that the write cannot upgrade while another partition writes
            cur.execute("SELECT total_changes()" if self.config.driver == "sqlite" else f"SELECT count(*) FROM {self._name(table)}")
            return int(cur.fetchone()[0])

        try:
            before = count() if sent is not None and self.config.driver != "sqlite" else 0
            cur.adbc_ingest(table, data, mode=mode, db_schema_name=self.config.db_schema)
            stored = count() - before if sent is not None else None
            if sent is not None:
                check_stored(f"{self._where()} table {self.config.table}", partition or "", sent(), stored)
            conn.commit()
            return stored
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.rollback()
            if isinstance(exc, ConveyorError):
                raise
            raise self._translate(exc, f"ingesting into {table}", partition) from None
        finally:
            cur.close()
            conn.close()

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        """Each partition is one ingest, in its own transaction, counted in it (append: final there)."""
        mode = self.options.load_mode
        return TargetInfo(label=f"{self._where()} table {self.config.table}",
                          path=staged_path(mode, f"arrow: adbc_ingest through the {self.config.driver} driver"))

    def _writable(self, schema: Any) -> Any:
        """The schema as written: SQLite has no decimal (written as exact text) and no view types."""
        import pyarrow as pa

        from conveyor.kit.arrowutil import without_views

        schema = without_views(schema)
        if self.config.driver != "sqlite":
            return schema
        return pa.schema([f.with_type(pa.string()) if pa.types.is_decimal(f.type) else f for f in schema])

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        import pyarrow as pa

        mode, schema = self.options.load_mode, self._writable(request.schema)
        lengths: tuple[tuple[str, str, int, str], ...] = ()
        where = f"{self._where()} table {self.config.table}"
        target = self._target_columns()
        stage = f"_conveyor_stage_{self.options.run_id}"
        check_mode(mode, target is not None, where)
        if mode in ("create", "replace") or target is None:
            pairs = [(n, n) for n in schema.names]
        else:
            pairs = map_columns(schema.names, target, self.options.map_method, where, self.options.schema_drift)
            if self.config.driver != "sqlite":  # typed columns: the cast policy applies
                from conveyor.kit.casts import ColumnType, check_casts

                tschema = self._target_schema
                check_casts(pairs, [ColumnType.of_field(schema.field(s)) for s, _ in pairs],
                            [_column_type(tschema.field(t)) for _, t in pairs], where, self.config.allow_cast,
                            engine=f"the {self.config.driver} database")
                # the driver writes each column as its Arrow type (binary COPY for PostgreSQL): an
                # int32 into a bigint column must be an int64 first (checked value by value)
                to = {s: tschema.field(t).type for s, t in pairs if _castable(schema.field(s).type, tschema.field(t).type)}
                schema = pa.schema([f.with_type(to[f.name]) if f.name in to else f for f in schema])
                lengths = self._text_lengths(pairs, tschema)
        write_table = self.config.table
        if mode != "append":
            out_schema = pa.schema([pa.field(t, schema.field(s).type) for s, t in pairs])
            if mode == "truncate":
                self._sql_step(f"CREATE TABLE {self._name(stage)} AS SELECT * FROM {self._name()} WHERE 1 = 0", mode)
            else:
                self._ingest(stage, pa.Table.from_batches([], schema=out_schema), "create")
            write_table = stage
        before = self.count_rows_of(self.config.table) if mode == "append" and self.options.verify != "none" else 0
        return SinkPlan(
            rows_before=before,
            target=f"{self._where()} {self.config.table}", write_target=write_table, load_mode=mode,
            columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema, own=lengths,
        )  # batches are conformed (cast) to ``schema`` on their way in; ``own``: the lengths to check

    def _text_lengths(self, pairs: list[tuple[str, str]], tschema: Any) -> tuple[tuple[str, str, int, str], ...]:
        """(source, target, n, type) of each varchar(n) / char(n) target column where the driver names
        PostgreSQL's types (its field metadata; the lengths come from information_schema): PostgreSQL
        cuts a longer value's excess trailing spaces without an error, so each value's length is
        checked first (not for columns in ``allow_cast``)."""
        allowed = set(self.config.allow_cast)
        texts = [(s, t) for s, t in pairs if _column_type(tschema.field(t)).db in ("varchar", "bpchar")
                 and t not in allowed and "*" not in allowed]
        if not texts:
            return ()
        rows = self._run("SELECT column_name, character_maximum_length, data_type FROM information_schema.columns "
                         "WHERE table_schema = coalesce($1, current_schema()) AND table_name = $2 "
                         "AND character_maximum_length IS NOT NULL", [self.config.db_schema, self.config.table],
                         doing="reading the target's column lengths")  # PostgreSQL's driver: $n parameters
        limits = {name: (int(n), f"{typ}({n})") for name, n, typ in rows}
        return tuple((s, t, *limits[t]) for s, t in texts if t in limits)

    def _sql_step(self, sql: str, mode: str) -> None:
        try:
            self._run(sql, doing=f"load_mode={mode}")
        except ConveyorError as exc:
            raise SchemaError(f"{exc.message}", hint=f"the {self.config.driver} driver cannot do load_mode={mode}; use append") from None

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import pyarrow as pa

        start = time.perf_counter()
        out_schema = pa.schema([pa.field(t, plan.schema.field(s).type) for s, t in zip(plan.source_columns, plan.columns)])

        if plan.own:  # varchar(n) / char(n) targets: each value's length, before the database sees it
            batches = length_checked(batches, plan.own, part.key, self.config.driver)

        def renamed() -> Iterator[Any]:
            for batch in CountingBatches(batches, plan.schema):
                yield pa.RecordBatch.from_arrays([batch.column(s) for s in plan.source_columns], schema=out_schema)

        counted = CountingBatches(renamed())
        reader = pa.RecordBatchReader.from_batches(out_schema, counted)
        try:
            stored = self._ingest(plan.write_target, reader, "append", part.key,
                                  sent=(lambda: counted.rows) if self.options.verify != "none" else None)
        except ConveyorError:
            if counted.error is not None:
                raise counted.error from None
            raise
        return WriteStats(part.key, counted.rows if stored is None else stored, counted.bytes, time.perf_counter() - start)

    def target_rows(self, plan: SinkPlan) -> int:
        return self.count_rows_of(plan.write_target)

    def count_rows_of(self, table: str) -> int:
        return int(self._run(f"SELECT count(*) FROM {self._name(table)}")[0][0])

    # StagedSink's finalize / abort, in standard SQL through the driver

    def _qualified(self, table: str | None = None) -> str:
        return self._name(table)

    def _quote(self, name: str) -> str:
        return qident(name)

    def _in_one_transaction(self, plan: SinkPlan, steps: list[str], taken: Callable[[int], None] | None = None) -> None:
        conn = self._connect()
        cur = conn.cursor()
        try:
            for step in steps:
                cur.execute(step)
                if taken is not None and step.startswith("INSERT INTO"):
                    rows = cur.rowcount  # the driver's count of the rows the INSERT stored, where it gives one
                    if rows is None or rows < 0:  # else the target's, in the transaction (truncate emptied it first)
                        cur.execute(f"SELECT count(*) FROM {self._name()}")
                        rows = int(cur.fetchone()[0])
                    taken(rows)
            conn.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.rollback()
            if isinstance(exc, ConveyorError):
                raise
            raise SchemaError(f"{self._where()}: finishing load_mode={plan.load_mode}: {str(exc).splitlines()[0]}",
                              hint=f"the {self.config.driver} driver may not support it; use append") from None
        finally:
            cur.close()
            conn.close()

    def _drop(self, table: str) -> None:
        with contextlib.suppress(Exception):  # best effort: the run's own error matters more
            self._run(f"DROP TABLE IF EXISTS {self._name(table)}")


def _column_type(field: Any) -> Any:
    """A target column as the cast policy sees it: its Arrow type, and the database's own type name
    where the driver says it (PostgreSQL's driver does, in the field metadata)."""
    from conveyor.kit.casts import ColumnType

    meta = {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}
    return ColumnType(field.type, db=meta.get("POSTGRESQL:type", ""), sql=meta.get("POSTGRESQL:type", ""),
                      typmod=int(meta.get("POSTGRESQL:typmod", "-1")))


def _castable(src: Any, tgt: Any) -> bool:
    """Whether Arrow itself casts ``src`` to the plain type ``tgt`` (extension types are the driver's)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if src == tgt or isinstance(tgt, pa.BaseExtensionType) or isinstance(src, pa.BaseExtensionType):
        return False
    try:
        pc.cast(pa.nulls(0, src), tgt)  # not pa.array([]): a Python list makes pyarrow import pandas
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True

"""Any ADBC driver, by name: ``driver: sqlite`` loads ``adbc_driver_sqlite`` (package
``adbc-driver-sqlite``), ``postgresql``, ``flightsql``, ``snowflake``, ... whichever is installed.

Source: a table or a query; results arrive as Arrow from the driver. Where the driver offers
partitioned execution (``adbc_execute_partitions``, e.g. Flight SQL), ``strategy=native``
makes one partition per descriptor; the keyed strategies (rangeid, ntile, random,
datadriven) work through standard SQL with bound parameters.

Sink: ``adbc_ingest``, one transaction per partition. append ingests into the target;
create, replace and truncate load a staging table and swap it in with standard SQL at the
end; a driver that cannot do a step says so, naming the mode.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.arrowutil import CountingBatches, rebatch
from conveyor.connectors.sql import Dialect, SqlSource, key_kind
from conveyor.connectors.staged import StagedSink, check_mode
from conveyor.core import JobOptions, NativePartition, Partition, PrepareRequest, SinkPlan, SourceInfo, WriteStats
from conveyor.errors import ConfigError, ConnectError, ConveyorError, PluginError, SchemaError, TransferError, first_line, scrub_value
from conveyor.mapping import TargetColumn, map_columns


@dataclass
class AdbcConfig:
    #: the driver's short name: sqlite, postgresql, flightsql, snowflake, ...
    driver: str = "???"
    #: the driver's URI (a file for sqlite); put secrets in it only as ${oc.env:VAR}
    uri: str = ""
    #: database options passed to the driver (e.g. {adbc.flight.sql.authorization_header: ...})
    db_kwargs: dict[str, str] = field(default_factory=dict)


@dataclass
class AdbcSourceConfig(AdbcConfig):
    table: str | None = None
    db_schema: str | None = None
    query: str | None = None

    def __post_init__(self) -> None:
        if bool(self.table) == bool(self.query):
            raise ValueError("set exactly one of table or query")


@dataclass
class AdbcSinkConfig(AdbcConfig):
    table: str = "???"
    db_schema: str | None = None
    #: columns whose values may change type by the database's own conversion; ["*"]: every column.
    #: By default a type change that could alter a value is refused (conveyor/casts.py); SQLite,
    #: whose columns have affinities rather than types, is not judged
    allow_cast: list[str] = field(default_factory=list)


def _module(driver: str) -> Any:
    name = f"adbc_driver_{driver.replace('-', '_')}"
    try:
        return importlib.import_module(f"{name}.dbapi")
    except ModuleNotFoundError:
        raise PluginError(f"adbc driver {driver!r} is not installed",
                          hint=f"pip install adbc-driver-{driver.replace('_', '-')}") from None


def _qident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _Adbc:
    config: AdbcConfig

    def _connect(self, partition: str | None = None) -> Any:
        import adbc_driver_manager

        dbapi = _module(self.config.driver)
        extra = {"db_kwargs": dict(self.config.db_kwargs)} if self.config.db_kwargs else {}
        try:
            conn = dbapi.connect(self.config.uri, **extra)
        except adbc_driver_manager.Error as exc:
            raise self._translate(exc, "cannot connect", partition) from None
        except TypeError:
            raise ConfigError(f"{self._where()}: this driver takes no db_kwargs", key="db_kwargs") from None
        if self.config.driver == "sqlite":  # several writers wait their turn instead of failing
            cur = conn.cursor()
            cur.execute("PRAGMA busy_timeout = 60000")
            cur.fetchall()
            cur.close()
        return conn

    def _where(self) -> str:
        return f"adbc {self.config.driver}"

    def _translate(self, exc: BaseException, doing: str, partition: str | None = None) -> ConveyorError:
        if isinstance(exc, ConveyorError):
            return exc
        text = first_line(exc)
        text = scrub_value(text, *_secrets(self.config.db_kwargs))
        msg = f"{self._where()}: {doing}: {text}"
        low = text.lower()
        if "unauthenticated" in low or "authentication" in low or "password" in low:
            return ConnectError(msg, hint="check the credentials")
        if doing == "cannot connect" or "unavailable" in low or "connection refused" in low:
            if partition is None:
                return ConnectError(msg, hint="check the uri and that the server is running")
            return TransferError(msg, partition=partition, retriable=True)
        if "no such table" in low or "does not exist" in low or "not found" in low:
            return SchemaError(msg, hint="check the table / query")
        return TransferError(msg, partition=partition, retriable="locked" in low or "busy" in low)

    def _run(self, sql: str, params: list[Any] | None = None, doing: str = "query") -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            cur = conn.cursor()
            try:
                cur.execute(sql, parameters=params or None)
                return cur.fetchall() if cur.description else []
            except Exception as exc:
                raise self._translate(exc, doing) from None
            finally:
                cur.close()
        finally:
            with contextlib.suppress(Exception):
                conn.commit()
            conn.close()


class AdbcDialect(Dialect):
    """Standard SQL with the driver's placeholders ("?", or "$1" for postgresql)."""

    def __init__(self, driver: str) -> None:
        self.name = f"adbc {driver}"
        self.numbered = driver == "postgresql"

    def placeholder(self, i: int) -> str:
        return f"${i}" if self.numbered else "?"


class AdbcSource(_Adbc, SqlSource):
    """Reads a table or query through any ADBC driver."""

    config_class = AdbcSourceConfig

    def __init__(self, config: AdbcSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._schema: Any = None
        self.dialect = AdbcDialect(config.driver)

    def _sql(self) -> str:
        if self.config.query:
            return self.config.query
        table = _qident(self.config.table or "")
        return f"SELECT * FROM {_qident(self.config.db_schema) + '.' if self.config.db_schema else ''}{table}"

    def _from(self) -> str:
        return f"({self._sql()}) AS _conveyor_q"

    def describe(self) -> SourceInfo:
        """The schema: the table's declared one, or (for a query) that of its first rows.

        Some drivers (SQLite) type columns from the data they see; every batch read is cast to
        this schema, so all partitions agree.
        """
        conn = self._connect()
        cur = conn.cursor()
        try:
            try:
                if self.config.table:
                    self._schema = conn.adbc_get_table_schema(self.config.table, db_schema_filter=self.config.db_schema)
                else:
                    cur.execute(f"SELECT * FROM {self._from()} LIMIT 1000")
                    self._schema = cur.fetch_record_batch().schema
            except Exception as exc:
                raise self._translate(exc, "describing the source") from None
        finally:
            cur.close()
            conn.close()
        what = f"table {self.config.table}" if self.config.table else "query"
        return SourceInfo(schema=self._schema, label=f"adbc {self.config.driver} {what}")

    # --- partitions --------------------------------------------------------------------------

    def native_partitions(self) -> list[NativePartition]:
        conn = self._connect()
        cur = conn.cursor()
        try:
            try:
                descriptors, _ = cur.adbc_execute_partitions(self._sql())
            except Exception as exc:
                if "NOT_IMPLEMENTED" in str(exc) or type(exc).__name__ == "NotSupportedError":
                    from conveyor.errors import PlanningError

                    raise PlanningError(f"strategy=native: the {self.config.driver} driver has no partitioned execution",
                                        hint="use strategy=none, rangeid, ntile, random or datadriven") from None
                raise self._translate(exc, "partitioning the query") from None
        finally:
            cur.close()
            conn.close()
        n = len(descriptors)
        return [NativePartition(index=i, count=n, token=bytes(d), label=f"driver partition {i + 1} of {n}") for i, d in enumerate(descriptors)]

    def _column_type(self, column: str) -> Any:
        if self._schema is None:
            self.describe()
        if column not in self._schema.names:
            raise SchemaError(f"{self._where()} source: distribute_key {column!r} is not a column",
                              hint=f"columns are: {', '.join(self._schema.names)}")
        return self._schema.field(column).type

    def _key_kind(self, column: str) -> str:
        return key_kind(self._column_type(column))

    def _relation(self) -> str:
        return self._from()

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self._run(sql, params)

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        """Each partition's row count in one scan (None for driver partitions, which cannot be counted)."""
        if any(isinstance(p, NativePartition) for p in parts):
            return None
        return SqlSource.count_rows(self, parts)

    # --- reading -------------------------------------------------------------------------------

    def read(self, part: Partition) -> Iterator[Any]:
        conn = self._connect(part.key)
        cur = conn.cursor()
        try:
            try:
                if isinstance(part, NativePartition):
                    reader = cur.adbc_read_partition(part.token)
                else:
                    where, params = self._predicate(part)
                    cur.execute(f"SELECT * FROM {self._from()}{where}", parameters=params or None)
                    reader = cur.fetch_record_batch()
                if self._schema is None:
                    self.describe()
                yield from rebatch(CountingBatches(reader, self._schema), self.options.batch_size)
            except ConveyorError:
                raise
            except Exception as exc:
                raise self._translate(exc, f"reading {part.key}", part.key) from None
        finally:
            cur.close()
            with contextlib.suppress(Exception):
                conn.rollback()
            conn.close()


class AdbcSink(_Adbc, StagedSink):
    """Writes through ``adbc_ingest``; load modes beyond append need the driver to run SQL."""

    config_class = AdbcSinkConfig

    def __init__(self, config: AdbcSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.table = config.table

    def _name(self, table: str | None = None) -> str:
        t = _qident(table or self.config.table)
        return f"{_qident(self.config.db_schema)}.{t}" if self.config.db_schema else t

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

    def _ingest(self, table: str, data: Any, mode: str, partition: str | None = None) -> None:
        conn = self._connect(partition)
        cur = conn.cursor()
        try:
            cur.adbc_ingest(table, data, mode=mode, db_schema_name=self.config.db_schema)
            conn.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise self._translate(exc, f"ingesting into {table}", partition) from None
        finally:
            cur.close()
            conn.close()

    def _writable(self, schema: Any) -> Any:
        """The schema as written: SQLite has no decimal (written as exact text) and no view types."""
        import pyarrow as pa

        from conveyor.arrowutil import without_views

        schema = without_views(schema)
        if self.config.driver != "sqlite":
            return schema
        return pa.schema([f.with_type(pa.string()) if pa.types.is_decimal(f.type) else f for f in schema])

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        import pyarrow as pa

        mode, schema = self.options.load_mode, self._writable(request.schema)
        where = f"{self._where()} table {self.config.table}"
        target = self._target_columns()
        stage = f"_conveyor_stage_{self.options.run_id}"
        check_mode(mode, target is not None, where)
        if mode in ("create", "replace") or target is None:
            pairs = [(n, n) for n in schema.names]
        else:
            pairs = map_columns(schema.names, target, self.options.map_method, where)
            if self.config.driver != "sqlite":  # typed columns: the cast policy applies
                from conveyor.casts import ColumnType, check_casts

                tschema = self._target_schema
                check_casts(pairs, [ColumnType.of_field(schema.field(s)) for s, _ in pairs],
                            [_column_type(tschema.field(t)) for _, t in pairs], where, self.config.allow_cast)
                # the driver writes each column as its Arrow type (binary COPY for PostgreSQL): an
                # int32 into a bigint column must be an int64 first (checked value by value)
                to = {s: tschema.field(t).type for s, t in pairs if _castable(schema.field(s).type, tschema.field(t).type)}
                schema = pa.schema([f.with_type(to[f.name]) if f.name in to else f for f in schema])
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
            columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema,
        )  # batches are conformed (cast) to ``schema`` on their way in

    def _sql_step(self, sql: str, mode: str) -> None:
        try:
            self._run(sql, doing=f"load_mode={mode}")
        except ConveyorError as exc:
            raise SchemaError(f"{exc.message}", hint=f"the {self.config.driver} driver cannot do load_mode={mode}; use append") from None

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import pyarrow as pa

        start = time.perf_counter()
        out_schema = pa.schema([pa.field(t, plan.schema.field(s).type) for s, t in zip(plan.source_columns, plan.columns)])

        def renamed() -> Iterator[Any]:
            for batch in CountingBatches(batches, plan.schema):
                yield pa.RecordBatch.from_arrays([batch.column(s) for s in plan.source_columns], schema=out_schema)

        counted = CountingBatches(renamed())
        reader = pa.RecordBatchReader.from_batches(out_schema, counted)
        try:
            self._ingest(plan.write_target, reader, "append", part.key)
        except ConveyorError:
            if counted.error is not None:
                raise counted.error from None
            raise
        return WriteStats(part.key, counted.rows, counted.bytes, time.perf_counter() - start)

    def count_rows(self, plan: SinkPlan) -> int:
        return self.count_rows_of(plan.write_target)

    def count_rows_of(self, table: str) -> int:
        return int(self._run(f"SELECT count(*) FROM {self._name(table)}")[0][0])

    # StagedSink's finalize / abort, in standard SQL through the driver

    def _qualified(self, table: str | None = None) -> str:
        return self._name(table)

    def _quote(self, name: str) -> str:
        return _qident(name)

    def _in_one_transaction(self, plan: SinkPlan, steps: list[str]) -> None:
        conn = self._connect()
        cur = conn.cursor()
        try:
            for step in steps:
                cur.execute(step)
            conn.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise SchemaError(f"{self._where()}: finishing load_mode={plan.load_mode}: {str(exc).splitlines()[0]}",
                              hint=f"the {self.config.driver} driver may not support it; use append") from None
        finally:
            cur.close()
            conn.close()

    def _drop(self, table: str) -> None:
        with contextlib.suppress(Exception):  # best effort: the run's own error matters more
            self._run(f"DROP TABLE IF EXISTS {self._name(table)}")


def _secrets(kwargs: dict[str, Any]) -> list[str]:
    """Values a driver message must not show: every option's value, and a URI's password."""
    from urllib.parse import unquote, urlsplit

    out = [str(v) for v in kwargs.values() if v]
    for v in out[:]:
        if "://" in v:
            try:
                pw = urlsplit(v).password
            except ValueError:
                pw = None
            if pw:
                out += [pw, unquote(pw)]
    return out


def _column_type(field: Any) -> Any:
    """A target column as the cast policy sees it: its Arrow type, and the database's own type name
    where the driver says it (PostgreSQL's driver does, in the field metadata)."""
    from conveyor.casts import ColumnType

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
        pc.cast(pa.array([], src), tgt)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True

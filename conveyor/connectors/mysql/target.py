"""What the MySQL sink reads of its target before a row moves, and the types ``create`` gives: the
target's columns judged by the cast policy (its date-time columns by the server's own types), the
lengths of its varchar(n) / char(n) columns, the unique index a merge matches by, and how rows go in
(LOAD DATA where the server allows it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conveyor.connectors.mysql import loading
from conveyor.connectors.mysql.common import MYSQL_DIALECT, _duck_connection
from conveyor.core import TableDefinition
from conveyor.errors import ConfigError, SchemaError
from conveyor.kit import merge as merging
from conveyor.kit.mapping import TargetColumn

if TYPE_CHECKING:
    from conveyor.connectors.mysql.common import MySqlSinkConfig


def arrow_to_mysql(f: Any) -> str:
    """The MySQL column type ``create`` gives an Arrow field (values kept exactly, or refused by name)."""
    import pyarrow as pa
    import pyarrow.types as t

    typ = f.type
    if isinstance(typ, pa.BaseExtensionType) and typ.extension_name == "arrow.uuid":
        return "CHAR(36) CHARACTER SET ascii"  # its canonical text (MySQL has no uuid type): the same value, readable
    if isinstance(typ, pa.BaseExtensionType) and typ.extension_name == "arrow.json":
        return "LONGTEXT"  # the document's text as it is (MySQL's JSON type would reorder and reformat it)
    if t.is_dictionary(typ):
        typ = typ.value_type
    simple = [(t.is_boolean, "BOOLEAN"), (t.is_int8, "TINYINT"), (t.is_int16, "SMALLINT"), (t.is_int32, "INT"), (t.is_int64, "BIGINT"),
              (t.is_uint8, "TINYINT UNSIGNED"), (t.is_uint16, "SMALLINT UNSIGNED"), (t.is_uint32, "INT UNSIGNED"),
              (t.is_uint64, "BIGINT UNSIGNED"), (t.is_float32, "FLOAT"), (t.is_float64, "DOUBLE"), (t.is_date, "DATE"),
              (t.is_string, "LONGTEXT"), (t.is_large_string, "LONGTEXT"), (t.is_binary, "LONGBLOB"), (t.is_large_binary, "LONGBLOB"),
              (t.is_fixed_size_binary, "LONGBLOB")]
    if hasattr(t, "is_string_view") and (t.is_string_view(typ) or t.is_binary_view(typ)):
        return "LONGTEXT" if t.is_string_view(typ) else "LONGBLOB"
    for test, sql in simple:
        if test(typ):
            return sql
    if t.is_timestamp(typ):
        if typ.unit == "ns":
            raise SchemaError(f"column {f.name}: {typ} has nanoseconds; MySQL keeps microseconds",
                              hint="cast it to microseconds in the source")
        return "DATETIME(6)"  # a timestamp with a time zone is kept as its UTC wall-clock time
    if t.is_time(typ) and typ.unit in ("s", "ms", "us"):
        return "TIME(6)"
    if t.is_decimal(typ) and typ.precision <= 65 and typ.scale <= 30:
        return f"DECIMAL({typ.precision},{typ.scale})"
    raise SchemaError(f"column {f.name}: Arrow type {typ} has no exact MySQL type",
                      hint="cast it in the source (e.g. to text), or create the target table yourself")


def _own_mapping(typ: Any) -> bool:
    """Whether ``create`` gives this Arrow type a column of another kind that holds it exactly by design
    (arrow_to_mysql: a zoned timestamp as its UTC wall-clock time, a uuid as its canonical text)."""
    import pyarrow as pa

    return (pa.types.is_timestamp(typ) and typ.tz is not None) or (isinstance(typ, pa.BaseExtensionType)
                                                                     and typ.extension_name == "arrow.uuid")


def text_lengths(config: MySqlSinkConfig, pairs: list[tuple[str, str]], table: str) -> tuple[tuple[str, str, int, str], ...]:
    """MyPlan.lengths: the varchar(n) / char(n) columns of ``table`` the rows go into (not those
    ``sink.allow_cast`` leaves to MySQL's own rules)."""
    rows = config.run("SELECT column_name, character_maximum_length, column_type FROM information_schema.columns "
                           f"WHERE table_schema = DATABASE() AND table_name = {MYSQL_DIALECT.literal(table)} "
                           "AND data_type IN ('varchar', 'char')", doing="reading the target")
    limits = {name.lower(): (int(n), typ) for name, n, typ in rows}
    allowed = {c.lower() for c in config.allow_cast}
    return tuple((s, t, *limits[t.lower()]) for s, t in pairs
                 if t.lower() in limits and "*" not in allowed and t.lower() not in allowed)


def merge_plan(config: MySqlSinkConfig, where: str, pairs: list[tuple[str, str]], target: list[TargetColumn]) -> merging.MergePlan:
    """merge's keys, which must be exactly a unique index of the target, and the target's only one:
    INSERT ... ON DUPLICATE KEY UPDATE matches rows by any unique index."""
    rows = config.run("SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics "
                           f"WHERE table_schema = DATABASE() AND table_name = {MYSQL_DIALECT.literal(config.table)} "
                           "AND non_unique = 0 GROUP BY index_name", doing="reading the target's keys")
    uniques = {name: tuple(cols.split(",")) for name, cols in rows}
    plan = merging.plan(config, list(uniques.get("PRIMARY", ())), [t for _, t in pairs], [c.name for c in target], where)
    if sorted(plan.keys) not in [sorted(u) for u in uniques.values()]:
        raise ConfigError(f"load_mode=merge into {where}: no unique index is exactly ({', '.join(plan.keys)})",
                          key="sink.merge_keys", hint="MySQL upserts by a unique index: add one on the merge keys, or merge on the "
                                                      "primary key")
    if len(uniques) > 1:
        raise ConfigError(f"load_mode=merge into {where}: it has {len(uniques)} unique indexes "
                          f"({', '.join(sorted(uniques))}); ON DUPLICATE KEY UPDATE would match a row by any of them",
                          key="sink.merge_keys", hint="merge into a table whose only unique index is the merge key")
    return plan


def bulk(config: MySqlSinkConfig) -> tuple[str, str]:
    """(load_data | insert, why) for ``sink.bulk``."""
    asked = config.bulk
    if asked == "insert":
        return "insert", "mysql: batched INSERTs through DuckDB's mysql extension (sink.bulk=insert)"
    allowed = str(config.run("SELECT @@local_infile", doing="reading the server's settings")[0][0]) in ("1", "ON")
    if allowed:
        return "load_data", f"mysql: LOAD DATA LOCAL INFILE, CSV written by DuckDB into a pipe (sink.bulk={asked})"
    if asked == "load_data":
        raise ConfigError(f"{config.where()}: sink.bulk=load_data: the server does not allow LOAD DATA LOCAL INFILE "
                          "(local_infile is OFF)", hint="SET GLOBAL local_infile = 1 on the server, or sink.bulk=insert")
    return "insert", "mysql: batched INSERTs through DuckDB's mysql extension (the server's local_infile is OFF)"


def check_types(config: MySqlSinkConfig, load_mode: str, pairs: list[tuple[str, str]], schema: Any, table: str, where: str) -> None:
    """The cast policy (conveyor/kit/casts.py) against the target's columns as DuckDB sees them."""

    from conveyor.kit.casts import ColumnType, check_casts

    with _duck_connection(config, write=True) as duck:
        try:
            duck.execute("CALL mysql_clear_cache()")
            target = duck.execute(f"SELECT * FROM {loading.in_duck(config, table)} LIMIT 0").arrow().schema
        except Exception as exc:
            raise config.translate(exc, "reading the target's columns") from None
    sources = [ColumnType.of_field(schema.field(s)) for s, _ in pairs]
    times = time_columns(config, table)
    targets = [times.get(t.lower()) or ColumnType(target.field(t).type) for _, t in pairs]
    if load_mode in ("create", "replace"):  # our own DATETIME(6) holds a UTC time, CHAR(36) a uuid's text:
        targets = [s if _own_mapping(s.arrow) else t for s, t in zip(sources, targets)]  # the documented mappings
    check_casts(pairs, sources, targets, where, config.allow_cast, engine="MySQL",
                note="a time without a zone is then read as UTC: Conveyor's MySQL sessions use time_zone '+00:00'")


def time_columns(config: MySqlSinkConfig, table: str) -> dict[str, Any]:
    """The target's date-time columns as the cast policy judges them, from the server's own types (DuckDB
    sees each as a microsecond timestamp): TIMESTAMP is an instant (stored in UTC, shown in the session's
    time zone: a time without a zone is not one), DATETIME a wall-clock time; both keep their precision's
    fractional digits (MySQL rounds or cuts the rest without a word)."""
    import pyarrow as pa

    from conveyor.kit.casts import ColumnType

    rows = config.run("SELECT column_name, data_type, datetime_precision, column_type FROM information_schema.columns "
                           f"WHERE table_schema = DATABASE() AND table_name = {MYSQL_DIALECT.literal(table)} "
                           "AND data_type IN ('timestamp', 'datetime', 'time')", doing="reading the target")
    kinds = {"timestamp": (pa.timestamp("us", tz="UTC"), "timestamptz"), "datetime": (pa.timestamp("us"), "timestamp"),
             "time": (pa.time64("us"), "time")}
    return {name.lower(): ColumnType(kinds[typ][0], db=kinds[typ][1], sql=str(sql), typmod=int(digits or 0))
            for name, typ, digits, sql in rows}


def created_columns(schema: Any, info: Any, definition: bool) -> tuple[str, str, str]:
    """(column list of a CREATE TABLE from ``schema``, the table's comment or "", what the log says) with
    the source table's NOT NULL, primary key and column comments where ``definition`` (``sink.definition``).
    A key on a LONGTEXT / LONGBLOB column (MySQL keys need a length there) is left out and said."""
    from conveyor.connectors.mysql.common import qident

    d = info.definition if definition else None
    names = set(schema.names)
    key = [c for c in info.primary_key] if definition and info.primary_key and set(info.primary_key) <= names else []
    types = {f.name: arrow_to_mysql(f) for f in schema}
    unkeyable = [c for c in key if types[c].startswith(("LONGTEXT", "LONGBLOB"))]
    not_null = (set(d.not_null) if d is not None else set()) | set(key)
    comments = dict(d.column_comments) if d is not None else {}

    def quoted(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"

    cols = [f"{qident(f.name)} {types[f.name]}" + (" NOT NULL" if f.name in not_null else "")
            + (f" COMMENT {quoted(comments[f.name])}" if f.name in comments else "") for f in schema]
    if key and not unkeyable:
        cols.append(f"PRIMARY KEY ({', '.join(qident(c) for c in key)})")
    if d is None and not key:
        return ", ".join(cols), "", ""
    left = [f"primary key ({', '.join(unkeyable)}: MySQL keys a LONGTEXT / LONGBLOB column only by a prefix)"] if unkeyable else []
    said = TableDefinition.said(((len(not_null & names), "NOT NULL"), (1 if key and not unkeyable else 0, "primary key"),
                                 (len(comments) + (d is not None and d.comment is not None), "comment(s)")),
                                left + (d.beyond_keys() if d is not None else []))
    return ", ".join(cols), (d.comment or "") if d is not None else "", said

"""CSV keeps NULL apart from '' both ways and reads numbers exactly.

PostgreSQL's convention: every text value is quoted, NULL is the null marker unquoted ('' by
default), so "" is an empty string and "NULL" a text. On the main this started from, the CSV source
read the unquoted empty field of a text column as '' (NULL became an empty string, exit 0) and every
number with a decimal point as a double (numeric(15,2) could not be loaded exactly from CSV at all).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from conveyor.errors import ConfigError, SchemaError, TransferError
from tests.helpers import checksum, job, pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")


COLUMNS = "id int, t text, n numeric(15,2), wide numeric(38,10), f float8, d date, b bool"


def test_postgres_to_csv_to_postgres_keeps_null_empty_text_and_numerics(pg_source, pg_target, tmp_path: Path) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS csv_vals", f"CREATE TABLE csv_vals ({COLUMNS})",
            "INSERT INTO csv_vals VALUES (1, NULL, 1.50, 12345678901234567890.0123456789, 0.1, '2020-01-01', true), "
            "(2, '', NULL, NULL, NULL, NULL, NULL), (3, 'NULL', -2.05, -0.0000000001, 1e-7, '1999-12-31', false), "
            "(4, 'x,y\"z', 9999999999999.99, 0, 'NaN', NULL, NULL), (5, E'line\\nbreak', 0.00, 1, '-Infinity', '2000-02-29', true), "
            "(6, 'NA', 0.01, 2.5, 1.5, NULL, NULL)")
    out = tmp_path / "csv"
    job({"type": "postgres", "port": pg_source.port, "table": "csv_vals"}, {"type": "csv", "path": str(out)}, load_mode="replace")
    text = "".join(p.read_text() for p in sorted(out.glob("*.csv")))
    assert '\n1,,"1.50",' in text and '\n2,"",,' in text and '\n3,"NULL",' in text  # NULL bare, '' and "NULL" quoted
    assert '"0.0000000000"' in text and "E-" not in text  # decimals as PostgreSQL prints them, not 0E-10
    pg_exec(pg_target, "DROP TABLE IF EXISTS csv_vals", f"CREATE TABLE csv_vals ({COLUMNS})")
    job({"type": "csv", "path": str(out)}, {"type": "postgres", "port": pg_target.port, "table": "csv_vals"}, load_mode="append")
    assert checksum(pg_target, "csv_vals") == checksum(pg_source, "csv_vals")
    assert pg_exec(pg_target, "SELECT id FROM csv_vals WHERE t IS NULL") == [(1,)]
    assert pg_exec(pg_target, "SELECT id FROM csv_vals WHERE t = ''") == [(2,)]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_numbers_with_a_decimal_point_are_read_as_decimals(tmp_path: Path) -> None:
    import pyarrow as pa

    from conveyor.connectors.files.sources import CsvSource, CsvSourceConfig
    from conveyor.core import JobOptions, WholeSource

    _write(tmp_path / "in" / "a.csv", 'price,ratio,qty,name\n1.5,1e-3,1,"a"\n-2.25,0.5,,""\n,nan,3,\n')
    source = CsvSource(CsvSourceConfig(path=str(tmp_path / "in")), JobOptions())
    schema = source.describe().schema
    assert schema.field("price").type == pa.decimal128(38, 2)  # exact: not a double
    assert schema.field("ratio").type == pa.float64()  # an exponent or nan: a double's text
    assert schema.field("qty").type == pa.int64() and schema.field("name").type == pa.string()
    table = pa.Table.from_batches(list(source.read(WholeSource(index=0, count=1))))
    assert table.column("price").to_pylist() == [Decimal("1.50"), Decimal("-2.25"), None]
    assert table.column("name").to_pylist() == ["a", "", None]


def test_numbers_written_with_different_numbers_of_decimals_are_said_on_the_column(tmp_path: Path) -> None:
    from conveyor.connectors.files.sources import CsvSource, CsvSourceConfig
    from conveyor.core import JobOptions
    from conveyor.kit.casts import ColumnType

    _write(tmp_path / "in" / "a.csv", "varied,fixed,whole\n0.0,1.50,3\n1.25,2.00,4\n3,,\n")
    schema = CsvSource(CsvSourceConfig(path=str(tmp_path / "in")), JobOptions()).describe().schema
    assert [ColumnType.of_field(f).scales_varied for f in schema] == [True, False, False]


def test_a_csv_numeric_of_varied_decimals_into_numeric_without_a_scale_is_refused_and_read_as_text_exactly(
        pg_target, tmp_path: Path, cli) -> None:
    """One decimal column holds one scale: 0.0, 1.50 and 3 arrive in PostgreSQL's numeric (which keeps each value's own
    scale) as 0.00, 1.50 and 3.00. That is refused by name; read as text, PostgreSQL reads each as written. A column
    whose values share their scale, or a target with a scale of its own, loads as before."""
    _write(tmp_path / "in" / "a.csv", "id,n,m\n1,0.0,1.50\n2,1.50,2.00\n3,3,-0.10\n")
    pg_exec(pg_target, "DROP TABLE IF EXISTS csv_scales", "CREATE TABLE csv_scales (id int, n numeric, m numeric)",
            "INSERT INTO csv_scales VALUES (0, 0, 0)")
    args = ["run", "source=csv", f"source.path={tmp_path / 'in'}", "sink=postgres", f"sink.port={pg_target.port}", "sink.table=csv_scales",
            "load_mode=truncate"]
    res = cli(*args)
    assert res.code != 0 and "column n (decimal128(38, 2) -> numeric): the file writes its numbers with different numbers" in res.err
    assert "source.column_types={n: string} sink.allow_cast=[n]" in res.err and "Traceback" not in res.err
    assert pg_exec(pg_target, "SELECT * FROM csv_scales") == [(0, 0, 0)]  # the target as it was
    res = cli(*args, "source.column_types={n: string}", "sink.allow_cast=[n]")  # the hint, as written
    assert res.code == 0, res.err
    assert pg_exec(pg_target, "SELECT n::text, m::text FROM csv_scales ORDER BY id") == [("0.0", "1.50"), ("1.50", "2.00"), ("3", "-0.10")]
    pg_exec(pg_target, "ALTER TABLE csv_scales ALTER n TYPE numeric(10,3)")
    assert cli(*args).code == 0  # the target's own scale decides
    assert pg_exec(pg_target, "SELECT n::text FROM csv_scales ORDER BY id") == [("0.000",), ("1.500",), ("3.000",)]


def test_numbers_wider_than_38_digits_are_read_as_exact_wide_decimals_and_wider_still_refused_by_name(tmp_path: Path) -> None:
    """pyarrow's CSV reader has no decimal256: the CSV source's own inference of a 40-digit number stopped every read with
    "CSV conversion to decimal256(76, 1) is not supported", naming no column (the corpus's numeric column through CSV)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wide = "1234567890123456789012345678901234567890.5"
    _write(tmp_path / "in" / "a.csv", f"id,n\n1,{wide}\n2,-0.25\n3,\n")
    job({"type": "csv", "path": str(tmp_path / "in")}, {"type": "parquet", "path": str(tmp_path / "out")}, "files", load_mode="replace")
    table = pq.read_table(tmp_path / "out")
    assert pa.types.is_decimal256(table.schema.field("n").type)
    assert table.column("n").to_pylist() == [Decimal(wide), Decimal("-0.25"), None]
    _write(tmp_path / "in" / "b.csv", "id,n\n4," + "9" * 80 + ".5\n")  # 81 digits: no decimal holds it
    with pytest.raises(TransferError, match=r"b\.csv: column n \(decimal256\(76, 2\)\)") as caught:
        job({"type": "csv", "path": str(tmp_path / "in")}, {"type": "parquet", "path": str(tmp_path / "o2")}, "files", load_mode="replace")
    assert "{n: string}" in caught.value.hint
    report = job({"type": "csv", "path": str(tmp_path / "in"), "column_types": {"n": "string"}},
                 {"type": "parquet", "path": str(tmp_path / "o3")}, "files", load_mode="replace")
    assert report.rows == 4


def test_a_later_value_with_more_digits_is_refused_by_name_and_column_types_decide(tmp_path: Path) -> None:
    _write(tmp_path / "in" / "a.csv", "price\n1.5\n")
    _write(tmp_path / "in" / "b.csv", "price\n1.125\n")
    with pytest.raises(TransferError, match=r"b\.csv") as caught:
        job({"type": "csv", "path": str(tmp_path / "in")}, {"type": "parquet", "path": str(tmp_path / "out")}, "files", load_mode="replace")
    assert "source.column_types" in caught.value.hint
    report = job({"type": "csv", "path": str(tmp_path / "in"), "column_types": {"price": "decimal(10,3)"}},
                 {"type": "parquet", "path": str(tmp_path / "out")}, "files", load_mode="replace")
    assert report.rows == 2
    import pyarrow.parquet as pq

    assert str(pq.read_table(tmp_path / "out").schema.field("price").type) == "decimal128(10, 3)"
    with pytest.raises(ConfigError, match="no column nope"):
        job({"type": "csv", "path": str(tmp_path / "in"), "column_types": {"nope": "int64"}}, {"type": "parquet", "path": str(tmp_path / "o2")})


@pytest.mark.parametrize("column, typ, value", [("b", "bytea", "'\\x00ff'::bytea"), ("u", "uuid", "gen_random_uuid()")])
def test_a_column_csv_cannot_hold_is_refused_before_any_row_moves(pg_source, tmp_path: Path, column: str, typ: str, value: str) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS csv_bin", f"CREATE TABLE csv_bin (id int, {column} {typ})",
            f"INSERT INTO csv_bin VALUES (1, {value})")
    with pytest.raises(SchemaError, match=f"csv sink: column {column}"):
        job({"type": "postgres", "port": pg_source.port, "table": "csv_bin"}, {"type": "csv", "path": str(tmp_path / "out")},
            load_mode="replace")
    assert not list((tmp_path / "out").glob("**/*.csv"))


# --- malformed files: refused by name, nothing loaded -------------------------------------------------------------------


def _csv_to_duckdb(src: Path, tmp_path: Path) -> tuple[object, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    db = tmp_path / "t.duckdb"
    from conveyor.errors import ConveyorError

    try:
        job({"type": "csv", "path": str(src)}, {"type": "duckdb", "database": str(db), "table": "t"}, load_mode="replace")
    except ConveyorError as exc:
        return exc, db
    return None, db


def test_an_unclosed_quote_is_refused_by_name_and_a_closed_multiline_value_loads(tmp_path: Path) -> None:
    import duckdb

    bad = tmp_path / "bad.csv"
    bad.write_bytes(b'id,v\n1,ok\n2,"abc\n3,de\n')
    err, db = _csv_to_duckdb(bad, tmp_path)
    assert isinstance(err, TransferError) and "the quoted value of column v in row 2 is never closed" in str(err), err
    assert not db.exists() or duckdb.connect(str(db)).execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 't'").fetchone() == (0,)
    good = tmp_path / "good.csv"
    good.write_bytes(b'id,v\n1,ok\n2,"abc\n3,de"\n')  # a value with a line break, closed: one row of it, as written
    err, db = _csv_to_duckdb(good, tmp_path / "g")
    assert err is None
    assert duckdb.connect(str(db)).execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(1, "ok"), (2, "abc\n3,de")]


def test_bytes_that_are_not_utf8_are_refused_by_name_unless_read_as_binary(tmp_path: Path) -> None:
    src = tmp_path / "latin1.csv"
    src.write_bytes("id,name\n1,Zoë\n2,plain\n".encode("latin-1"))
    err, _ = _csv_to_duckdb(src, tmp_path)
    assert isinstance(err, SchemaError) and "column name holds bytes that are not UTF-8 text" in str(err), err
    assert "source.column_types={name: binary}" in (err.hint or "")


def test_an_empty_source_path_is_refused() -> None:
    with pytest.raises(ConfigError, match="source.path is empty"):
        job({"type": "csv", "path": ""}, {"type": "parquet", "path": "/tmp/never-written"}, load_mode="replace")


def test_a_parquet_file_named_as_csv_and_control_bytes_are_never_printed_raw(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "data.csv")
    err, _ = _csv_to_duckdb(tmp_path / "data.csv", tmp_path / "p")
    assert isinstance(err, SchemaError) and str(err).endswith("is a Parquet file (it starts with PAR1)") and "source=parquet" in err.hint
    bad = tmp_path / "ctl.csv"
    bad.write_bytes(b"a,b\n1,2,3\x01\x1b[31m\n")
    err, _ = _csv_to_duckdb(bad, tmp_path / "c")
    assert isinstance(err, SchemaError) and "\\x01\\x1b[31m" in str(err) and "\x1b" not in str(err), str(err)

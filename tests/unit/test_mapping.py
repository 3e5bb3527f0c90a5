from __future__ import annotations

import pytest

from conveyor.errors import SchemaError
from conveyor.kit.mapping import TargetColumn, map_columns

TARGET = [TargetColumn("id", nullable=False), TargetColumn("Name"), TargetColumn("loaded_at", nullable=False, has_default=True)]


def test_by_name_exact_then_unique_case_insensitive() -> None:
    assert map_columns(["name", "id"], TARGET, "name", "t") == [("name", "Name"), ("id", "id")]


def test_by_name_reports_every_problem_at_once() -> None:
    with pytest.raises(SchemaError) as info:
        map_columns(["nme", "extra"], TARGET, "name", "t")
    msg = str(info.value)
    assert "source columns with no target column: nme, extra" in msg
    assert "NOT NULL target columns without a default the source does not fill: id" in msg


def test_ambiguous_case_insensitive_match_is_not_guessed() -> None:
    target = [TargetColumn("A"), TargetColumn("a")]
    with pytest.raises(SchemaError, match="no target column: A2"):
        map_columns(["A2"], target, "name", "t")
    assert map_columns(["a"], target, "name", "t") == [("a", "a")]


def test_by_position() -> None:
    assert map_columns(["x", "y", "z"], TARGET, "position", "t") == [("x", "id"), ("y", "Name"), ("z", "loaded_at")]
    with pytest.raises(SchemaError, match="the source has 2 columns, the target 3"):
        map_columns(["x", "y"], TARGET, "position", "t")


def test_a_cast_hint_names_the_targets_engine_and_quotes_names_an_override_needs_quoted() -> None:
    """Cast hints wrote allow_cast=[col with space] unquoted (not an override the command line takes) and
    named PostgreSQL for DuckDB and MySQL sinks."""
    import pyarrow as pa
    import pytest

    from conveyor.errors import SchemaError
    from conveyor.kit.casts import ColumnType, check_casts

    with pytest.raises(SchemaError) as caught:
        check_casts([("col with space", "col with space"), ("b", "b")], [ColumnType(pa.float64()), ColumnType(pa.float64())],
                    [ColumnType(pa.int32()), ColumnType(pa.int32())], "duckdb table t", engine="DuckDB")
    assert "let DuckDB cast it" in caught.value.hint and "sink.allow_cast=['col with space',b]" in caught.value.hint

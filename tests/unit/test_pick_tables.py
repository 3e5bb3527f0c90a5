"""source.tables: which tables a job over several tables reads (no server: the catalog's rows are given)."""

from __future__ import annotations

import pytest

from conveyor.core import SourceTable
from conveyor.errors import SchemaError
from conveyor.kit.sql import pick_tables

FOUND = [(SourceTable("tpch", "lineitem", 900), True), (SourceTable("tpch", "orders", 300), True),
         (SourceTable("tpch", "region", 1), True), (SourceTable("tpch", "big_view", 0), False),
         (SourceTable("tpch", "_conveyor_commits", 5), True), (SourceTable("public", "orders", 50), True)]


def names(tables: list[SourceTable]) -> list[str]:
    return [t.qualified for t in tables]


def test_a_schema_pattern_takes_its_tables_largest_first_never_views_or_conveyors_own() -> None:
    assert names(pick_tables(FOUND, ["tpch.*"], [], "public", "here")) == ["tpch.lineitem", "tpch.orders", "tpch.region"]


def test_bare_names_are_of_the_source_schema_and_exact_names_take_views() -> None:
    assert names(pick_tables(FOUND, ["orders", "tpch.big_view"], [], "public", "here")) == ["public.orders", "tpch.big_view"]


def test_exclude_and_overlapping_patterns_name_each_table_once() -> None:
    assert names(pick_tables(FOUND, ["tpch.*", "tpch.o*", "*.orders"], ["tpch.r?gion"], "public", "here")) == \
        ["tpch.lineitem", "tpch.orders", "public.orders"]


def test_a_name_that_matches_nothing_and_a_job_left_without_tables_are_errors() -> None:
    with pytest.raises(SchemaError, match=r"tpch\.nope is not a table on here"):
        pick_tables(FOUND, ["tpch.*", "tpch.nope"], [], "public", "here")
    with pytest.raises(SchemaError, match="names no table"):
        pick_tables(FOUND, ["tpch.*"], ["tpch.*"], "public", "here")

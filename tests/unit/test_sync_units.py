"""Sync jobs' pieces that need no server: positions, the default slot name, what a schema change is called, and
the configs refused by name before anything connects."""

from __future__ import annotations

import pytest

from conveyor.config import build_job
from conveyor.connectors.postgres.replication import changed_columns, check_slot_name, lsn, lsn_text, slot_name
from conveyor.errors import ConfigError
from conveyor.pipelines.sync import check, slot_of
from conveyor.submit import compose


def test_positions_read_and_print_as_the_server_does() -> None:
    assert lsn("0/1A751D8") == 0x1A751D8 and lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert lsn_text(lsn("16/B374D848")) == "16/B374D848" and lsn_text(0) == "0/0"


def test_a_schema_change_is_named_column_by_column() -> None:
    before = "id bigint, a text, n numeric(10,2); primary key (id)"
    after = "id bigint, a character varying(100), extra integer; primary key (id, a)"
    assert changed_columns(before, after) == ("column extra added (integer); column n dropped; column a retyped from text to "
                                              "character varying(100); primary key (id) is now primary key (id, a)")


def test_slot_names_are_checked_and_the_default_is_one_per_source_and_target() -> None:
    assert slot_name("a", "b") == slot_name("a", "b") != slot_name("a", "c")
    assert check_slot_name("conveyor_orders_1") == "conveyor_orders_1"
    with pytest.raises(ConfigError, match="is not a slot name"):
        check_slot_name("Orders-Sync")
    base = ["source=postgres", "sink=postgres", "source.table=t", "load_mode=replace", "incremental.method=replication"]
    one, two = (slot_of(build_job(compose([*base, f"sink.table={t}"]))) for t in ("x", "y"))
    assert one != two and one.startswith("conveyor_")
    assert slot_of(build_job(compose([*base, "sink.table=x", "degree=4"]))) == one  # options other than where do not move it
    assert slot_of(build_job(compose([*base, "sink.table=x", "incremental.slot=mine"]))) == "mine"


@pytest.mark.parametrize(("overrides", "says"), [
    (["sink=parquet", "sink.path=/tmp/x", "source.table=t"], "sink parquet cannot apply changes"),
    (["sink=postgres", "sink.table=t", "source.query=SELECT 1"], "the source must be postgres with source.table"),
    (["sink=postgres", "sink.table=t", "source.table=t", "load_mode=append"], "load_mode=append; a sync's first run loads each table"),
])
def test_configs_a_sync_cannot_run_are_refused_before_anything_connects(overrides: list[str], says: str) -> None:
    cfg = compose(["source=postgres", *overrides, "incremental.method=replication"] + ([] if any("load_mode" in o for o in overrides)
                                                                                       else ["load_mode=replace"]))
    with pytest.raises(ConfigError, match=says):
        check(build_job(cfg))

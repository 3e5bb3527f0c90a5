"""The example plugin's own tests: the connector contract, checked with Conveyor's kit.

Installing conveyor registers the kit as a pytest plugin, so the ``conveyor_contract`` fixture
is there without an import; these few lines are all a connector package needs."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from conveyor_example import SequenceSource, SequenceSourceConfig

from conveyor import registry
from conveyor.core import KeyRange


def test_the_sequence_source_keeps_the_contract(conveyor_contract) -> None:
    source = SequenceSource(SequenceSourceConfig(start=5, stop=25_000), conveyor_contract.options)
    plans = conveyor_contract.check_source(source)  # strategy=none, the one it serves
    assert len(plans["none"]) == 1
    # a partition kind it cannot read is refused with one of Conveyor's errors, with a hint
    err = conveyor_contract.check_read_error(source, KeyRange(index=0, count=1, column="n", lower=0, upper=10))
    assert err.hint == "use strategy=none"


def test_a_sink_takes_the_sequence_exactly_once(conveyor_contract, tmp_path: Path) -> None:
    source = SequenceSource(SequenceSourceConfig(stop=10_000), conveyor_contract.options)
    parquet = registry.load("sink", "parquet")
    written = conveyor_contract.check_sink(lambda options: parquet(parquet.config_class(path=str(tmp_path / "out")), options), source)
    assert written == 10_000
    assert sorted(pq.read_table(tmp_path / "out").column("n").to_pylist()) == list(range(10_000))

"""A source's Arrow schema given deferred (``DeferredSchema``): the job reads the columns' names without
making it, and ``SourceInfo.schema`` / ``PrepareRequest.schema`` still give the schema to whoever reads
them. A PostgreSQL -> PostgreSQL pass-through never makes it, so it never imports pyarrow (~0.07 s of
its start here): tests/connectors/postgres/test_copy_counts.py runs such a job where pyarrow cannot
be imported."""

from __future__ import annotations

import pickle
import threading

import pyarrow as pa
import pytest

from conveyor.core import DeferredSchema, PrepareRequest, SourceInfo

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


class Maker:
    """Makes SCHEMA, counting the calls (a module-level class: it pickles)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> pa.Schema:
        self.calls += 1
        return SCHEMA


def test_the_names_are_read_without_making_the_schema_and_reading_it_makes_it_once() -> None:
    maker = Maker()
    info = SourceInfo(DeferredSchema(maker, ["id", "name"]), "t", estimated_rows=3)
    request = PrepareRequest(schema=info.schema_as_given, info=info, partitions=2)
    assert info.column_names == request.column_names == ["id", "name"]
    assert maker.calls == 0 and isinstance(info.schema_as_given, DeferredSchema)
    assert request.schema.equals(SCHEMA) and info.schema.equals(SCHEMA)  # the request's and the info's: one making
    assert maker.calls == 1
    assert info == SourceInfo(SCHEMA, "t", estimated_rows=3)  # a made schema compares as the schema it is


def test_a_plain_schema_is_kept_as_given() -> None:
    info = SourceInfo(schema=SCHEMA, label="t")
    assert info.schema is SCHEMA and info.schema_as_given is SCHEMA and info.column_names == ["id", "name"]
    assert PrepareRequest(schema=info.schema_as_given, info=info).schema is SCHEMA


def test_a_pickled_deferred_schema_stays_deferred_until_made_and_a_made_one_travels_made() -> None:
    """A task pickles the source that holds it (runtime=local round-trips every task, Ray ships it):
    unmade, its maker goes along and the copy makes it only if it is read; made, the schema goes."""
    deferred = DeferredSchema(Maker(), ["id", "name"])
    copy = pickle.loads(pickle.dumps(deferred))
    assert isinstance(copy, DeferredSchema) and copy.names == ["id", "name"] and copy._make.calls == 0
    assert copy.get().equals(SCHEMA) and copy._make is None
    deferred.get()
    assert pickle.loads(pickle.dumps(deferred)).equals(SCHEMA)


def test_threads_that_read_it_at_once_make_it_once() -> None:
    maker = Maker()
    deferred = DeferredSchema(maker, ["id", "name"])
    got: list[pa.Schema] = []
    threads = [threading.Thread(target=lambda: got.append(deferred.get())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert maker.calls == 1 and len(got) == 8 and all(g is got[0] for g in got)


def test_the_field_is_read_only_and_required() -> None:
    info = SourceInfo(SCHEMA, "t")
    with pytest.raises(AttributeError):
        info.schema = SCHEMA  # type: ignore[misc]
    with pytest.raises(TypeError):
        SourceInfo(label="t")  # type: ignore[call-arg]

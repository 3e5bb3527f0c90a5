"""What the Iceberg source and sink share: the catalog (pyiceberg's ``load_catalog`` with the properties the config
gives: a SQL catalog on SQLite or PostgreSQL, REST, Glue, ...), the table, and the markers snapshots carry."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.lake.common import LOAD, PARTITION, failed, scrub, secret_values
from conveyor.errors import ConfigError, ConnectError, SchemaError, first_line


@dataclass
class IcebergConnConfig:
    #: the table, as namespace.name
    table: str = ""
    #: pyiceberg's catalog properties: {type: sql, uri: 'sqlite:///cat.db', warehouse: 'file:///wh'}, {type: rest, uri: ...},
    #: and the FileIO's (s3.endpoint, s3.access-key-id, ...); secrets as ${oc.env:VAR}. Empty: pyiceberg's own
    #: configuration (~/.pyiceberg.yaml, PYICEBERG_CATALOG__<NAME>__* variables) for catalog_name
    catalog: dict[str, Any] = field(default_factory=dict)
    catalog_name: str = "default"

    def __post_init__(self) -> None:
        if not self.table or "." not in self.table:
            raise ValueError(f"table: {self.table!r}: name the table as namespace.name")
        self.catalog = absolute_locations(dict(self.catalog))

    @property
    def identifier(self) -> tuple[str, str]:
        ns, name = self.table.rsplit(".", 1)
        return ns, name

    def secrets(self) -> list[str]:
        return secret_values(self.catalog)

    def load_catalog(self) -> Any:
        try:
            from pyiceberg.catalog import load_catalog
        except ImportError:
            raise ConfigError("the Iceberg connector needs pyiceberg", hint="pip install 'conveyor[iceberg]'") from None
        try:
            return load_catalog(self.catalog_name, **{k: str(v) for k, v in self.catalog.items()})
        except Exception as exc:
            raise ConnectError(f"iceberg catalog {self.catalog_name}: {type(exc).__name__}: {scrub(first_line(exc), self.secrets())}",
                               hint="check sink/source.catalog (type, uri, warehouse) and its credentials") from None

    def load(self, catalog: Any, name: str | None = None) -> Any | None:
        """The table (None where it does not exist)."""
        from pyiceberg.exceptions import NoSuchTableError

        ident = f"{self.identifier[0]}.{name or self.identifier[1]}"
        try:
            return catalog.load_table(ident)
        except NoSuchTableError:
            return None
        except Exception as exc:
            raise failed(f"iceberg table {ident}", exc, self.secrets(), hint="check the catalog and its storage") from None

    def where(self) -> str:
        return f"iceberg table {self.table}"


def absolute_locations(props: dict[str, Any]) -> dict[str, Any]:
    """A SQLite catalog file and a local warehouse given as relative paths, made absolute where the job is declared
    (a Ray worker runs in a folder of its own); the SQLite file's folder is made."""
    import os

    uri = str(props.get("uri", ""))
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        path = os.path.abspath(uri.removeprefix("sqlite:///"))
        with contextlib.suppress(OSError):  # (a folder that cannot be made: the catalog says so by name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
        props["uri"] = f"sqlite:///{path}"
    warehouse = str(props.get("warehouse", ""))
    if warehouse and "://" not in warehouse:
        props["warehouse"] = f"file://{os.path.abspath(warehouse)}"
    return props


def no_retry(table: Any) -> Any:
    """The table with pyiceberg's own commit retries off: a retry re-applies an append onto what another commit
    made without looking at it, where Conveyor looks first whether that commit was its own partition's."""
    props = dict(table.metadata.properties)
    props["commit.retry.num-retries"] = "0"
    table.metadata = table.metadata.model_copy(update={"properties": props})
    return table


def markers(table: Any, load: str) -> dict[str, tuple[int, int]]:
    """{partition: (rows it added, snapshot id)} of the snapshots (on any branch) this load committed."""
    out = {}
    for snap in table.metadata.snapshots:
        summary = snap.summary
        if summary is None:
            continue
        props = summary.additional_properties if hasattr(summary, "additional_properties") else {}
        if props.get(LOAD) == load and PARTITION in props:
            out[props[PARTITION]] = (int(props.get("added-records", 0)), snap.snapshot_id)
    return out


def added_files(table: Any, snapshot_ids: set[int]) -> list[Any]:
    """The data files the snapshots added (each read from its own manifests)."""
    from pyiceberg.manifest import ManifestEntryStatus

    out = []
    for snap in table.metadata.snapshots:
        if snap.snapshot_id not in snapshot_ids:
            continue
        for manifest in snap.manifests(table.io):
            if manifest.added_snapshot_id != snap.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snap.snapshot_id:
                    out.append(entry.data_file)
    return out


def referenced(table: Any) -> set[str]:
    """Every file any snapshot of the table refers to (data and delete files, manifests, manifest lists)."""
    out = set()
    for snap in table.metadata.snapshots:
        out.add(snap.manifest_list)
        for manifest in snap.manifests(table.io):
            out.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                out.add(entry.data_file.file_path)
    return out


def partition_spec(schema: Any, fields: list[str]) -> Any:
    """A partition spec from ``col``, ``day(col)`` (year, month, hour), ``bucket(N, col)``, ``truncate(W, col)``."""
    import re

    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import (
        BucketTransform,
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )

    made = []
    for i, text in enumerate(fields):
        m = re.fullmatch(r"\s*(?:(\w+)\(\s*(?:(\d+)\s*,\s*)?(\w+)\s*\)|(\w+))\s*", text)
        if not m:
            raise ConfigError(f"sink.partition_by: {text!r} is not col, day(col), bucket(N, col) or truncate(W, col)", key="sink.partition_by")
        fn, arg, col = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (None, None, m.group(4))
        try:
            source = schema.find_field(col)
        except ValueError:
            raise ConfigError(f"sink.partition_by: {col} is not a column of the source", key="sink.partition_by") from None
        simple = {"year": YearTransform, "month": MonthTransform, "day": DayTransform, "hour": HourTransform}
        if fn is None:
            transform, name = IdentityTransform(), col
        elif fn in simple and arg is None:
            transform, name = simple[fn](), f"{col}_{fn}"
        elif fn in ("bucket", "truncate") and arg is not None:
            transform = BucketTransform(int(arg)) if fn == "bucket" else TruncateTransform(int(arg))
            name = f"{col}_{fn}"
        else:
            raise ConfigError(f"sink.partition_by: {text!r}: unknown transform", key="sink.partition_by",
                              hint="use col, year/month/day/hour(col), bucket(N, col) or truncate(W, col)")
        made.append(PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name=name))
    return PartitionSpec(*made)


def iceberg_schema(arrow: Any) -> Any:
    """The Iceberg schema of an Arrow one (ids 1..n in order), refusing what it cannot hold by name."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    try:  # (converted without ids: -1 each; a partition spec names its source columns by id)
        return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow))
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"iceberg: {exc}", hint="cast the column in the source (source.query)") from None


def delete_quietly(io: Any, paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(Exception):
            io.delete(p)


__all__ = ["IcebergConnConfig", "no_retry", "markers", "added_files", "referenced", "partition_spec", "iceberg_schema", "delete_quietly"]

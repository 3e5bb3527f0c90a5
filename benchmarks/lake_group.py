"""bench.py's lake group: PostgreSQL -> Apache Iceberg and PostgreSQL -> Delta Lake (a local table), against the
library's own single-process write of the same rows, measured in the same run:

- the baseline reads the table with ADBC's PostgreSQL driver (``fetch_record_batch``: a stream of Arrow batches),
  turns its numeric columns (ADBC gives them as text) into decimal128 with Arrow's cast, and hands the stream to
  the library: pyiceberg's ``Table.append`` (into a table made beforehand with Conveyor's schema) or deltalake's
  ``write_deltalake``. One process, one connection.
- DuckDB is not a baseline here: its delta extension reads only, and its iceberg extension writes only into a
  REST catalog, which this machine has none of.

Each cell is checked by the table's own count (the snapshot's total-records; the Delta table's count).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def run(bench: Any, table: str, degrees: list[int], work: Path, conveyor: Any, psql: Any) -> None:
    import pyarrow as pa

    src = {"type": "postgres", "port": bench.src.port, "table": table}
    rows = int(psql(bench.src, f"SELECT count(*) FROM {table}"))
    numerics = {r.split("|")[0]: (int(r.split("|")[1]), int(r.split("|")[2])) for r in psql(
        bench.src, f"SELECT column_name || '|' || numeric_precision || '|' || numeric_scale FROM information_schema.columns "
                   f"WHERE table_name = '{table}' AND data_type = 'numeric'").split() if r}
    uri = f"postgresql://postgres:{bench.src.password}@127.0.0.1:{bench.src.port}/postgres"

    def adbc_stream() -> Any:
        """The table as ADBC reads it, its numeric columns cast from their text to decimal128 (batch by batch)."""
        import adbc_driver_postgresql.dbapi as pgdb

        con = pgdb.connect(uri)
        cur = con.cursor()
        cur.execute(f"SELECT * FROM {table}")
        reader = cur.fetch_record_batch()
        fields = [pa.field(f.name, pa.decimal128(*numerics[f.name]) if f.name in numerics else f.type) for f in reader.schema]
        schema = pa.schema(fields)

        def batches() -> Any:
            try:
                for batch in reader:
                    cols = [c.storage.cast(schema.field(i).type) if batch.schema.field(i).name in numerics else c
                            for i, c in enumerate(batch.columns)]
                    yield pa.RecordBatch.from_arrays(cols, schema=schema)
            finally:
                cur.close()
                con.close()

        return pa.RecordBatchReader.from_batches(schema, batches())

    lake = work / "lake"
    catalog_props = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db", "warehouse": f"file://{lake}/warehouse"}
    lake.mkdir(parents=True, exist_ok=True)
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("default", **catalog_props)
    catalog.create_namespace_if_not_exists("bench")
    name = f"bench.{table}"
    # the target's schema as Conveyor makes it, kept as a template (the baseline appends into a table made from it)
    conveyor({"source": src, "sink": {"type": "iceberg", "table": f"{name}_tpl", "catalog": catalog_props},
              "strategy": {"type": "ctid"}, "load_mode": "replace", "degree": 2})
    template = catalog.load_table(f"{name}_tpl").schema()

    def ice_reset() -> None:
        if catalog.table_exists(name):
            catalog.purge_table(name)

    def ice_rows() -> bool:
        snap = catalog.load_table(name).current_snapshot()
        return snap is not None and int(snap.summary.additional_properties["total-records"]) == rows

    def ice_library() -> None:
        made = catalog.create_table(name, schema=template)
        stream = adbc_stream()
        arrow = made.schema().as_arrow()
        cast = pa.RecordBatchReader.from_batches(arrow, (b.cast(arrow) for b in stream))
        made.append(cast)

    jobs = [("baseline ADBC read + pyiceberg append (one process)", ice_library, ice_rows, {"method": "library", "degree": 1, "baseline": True})]
    for degree in degrees:
        cfg = {"source": src, "sink": {"type": "iceberg", "table": name, "catalog": catalog_props}, "strategy": {"type": "ctid"},
               "load_mode": "create", "degree": degree}
        jobs.append((f"conveyor ctid degree={degree}", lambda c=cfg: conveyor(c), ice_rows, {"method": "ctid", "degree": degree}))
    bench.rounds(f"pg->iceberg {table}", jobs, ice_reset)

    path = lake / f"delta_{table}"

    def delta_reset() -> None:
        shutil.rmtree(path, ignore_errors=True)

    def delta_rows() -> bool:
        from deltalake import DeltaTable

        return DeltaTable(str(path)).count() == rows

    def delta_library() -> None:
        from deltalake import write_deltalake

        write_deltalake(str(path), adbc_stream(), mode="error")

    jobs = [("baseline ADBC read + write_deltalake (one process)", delta_library, delta_rows, {"method": "library", "degree": 1, "baseline": True})]
    for degree in degrees:
        cfg = {"source": src, "sink": {"type": "delta", "path": str(path)}, "strategy": {"type": "ctid"}, "load_mode": "create",
               "degree": degree}
        jobs.append((f"conveyor ctid degree={degree}", lambda c=cfg: conveyor(c), delta_rows, {"method": "ctid", "degree": degree}))
    bench.rounds(f"pg->delta {table}", jobs, delta_reset)

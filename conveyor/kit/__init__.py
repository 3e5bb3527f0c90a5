"""The kit a connector is built on: what SQL sources and table sinks share, apart from any one system.

=====================  ==================================================================================
module                 what it gives a connector
=====================  ==================================================================================
``kit.sql``            ``SqlSource`` (every keyed strategy, counts, checksums and incremental windows in a
                       ``Dialect`` of your database), ``pick_tables`` for ``source.tables`` patterns
``kit.staged``         ``StagedSink``: truncate / create / replace through a staging table, swapped in one
                       transaction; ``check_mode``, ``check_taken``, staging tables' labels (``Stage``)
``kit.merge``          ``load_mode=merge``: ``MergeOptions`` for a sink's config, the plan, the staged keys'
                       check and the merge read back in its own transaction (``apply``)
``kit.casts``          the cast policy: which column types move every value unchanged (``check_casts``)
``kit.mapping``        source columns onto a target's, by name or position (``map_columns``)
``kit.arrowutil``      Arrow batches counted, re-batched, cast, length-checked, without view types
``kit.guard``          the driver's run guard a sink's tasks check before they commit
``kit.credentials``    connection settings from the environment; passwords from variables or files
``kit.fs``             fsspec filesystems by URL, their errors as Conveyor's, a file's version
``kit.duckext``        DuckDB extensions loaded offline from their wheels, one attached DuckDB per process
``kit.canonical``      the canonical Arrow form rows are hashed in to compare engines (``conveyor verify``)
=====================  ==================================================================================

Importing ``conveyor.kit`` imports none of them: each name below loads its module when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "SqlSource": "sql", "Dialect": "sql", "pick_tables": "sql", "where_clause": "sql",
    "StagedSink": "staged", "check_mode": "staged", "check_taken": "staged", "swap_steps": "staged", "Stage": "staged",
    "stage_label": "staged",
    "MergeOptions": "merge", "MergePlan": "merge", "Merged": "merge",
    "ColumnType": "casts", "check_casts": "casts", "judge": "casts", "TEXT_OF": "casts",
    "TargetColumn": "mapping", "map_columns": "mapping",
    "CountingBatches": "arrowutil", "rebatch": "arrowutil", "cast_batches": "arrowutil", "length_checked": "arrowutil",
    "without_views": "arrowutil", "same_columns": "arrowutil",
    "RunGuard": "guard",
    "fill_from_env": "credentials", "read_password": "credentials",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor.kit' has no attribute {name!r}")
    return getattr(importlib.import_module(f"conveyor.kit.{module}"), name)


def __dir__() -> list[str]:
    return [*__all__, "arrowutil", "casts", "credentials", "duckext", "fs", "guard", "mapping", "merge", "sql", "staged"]

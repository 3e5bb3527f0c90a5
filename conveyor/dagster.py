"""Conveyor in Dagster (``pip install 'conveyor[dagster]'``): a copied table as a software-defined asset.

    import dagster as dg
    from conveyor.dagster import ConveyorResource, conveyor_asset

    orders = conveyor_asset("orders_copy", "pg_to_pg", "source.table=orders", sink={"table": "orders_copy"},
                            load_mode="replace", deps=["orders"])
    defs = dg.Definitions(assets=[orders], resources={"conveyor": ConveyorResource(run_dir="conveyor-runs")})

Materializing the asset runs the job through :func:`conveyor.run` (the same names and values as the
command line) in the Dagster run's process; its report becomes the materialization's metadata (rows,
bytes, partitions, seconds, target, the verification), and a failed job fails the step with Conveyor's
error (its message and hint). Dagster was chosen over Airflow for the integration: a copy is naturally an
asset with lineage (``deps``), and Dagster runs in-process, so the tests materialize real assets without a
scheduler or a metadata database; an Airflow task is a ``PythonOperator`` calling ``conveyor.run`` (docs/).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg

__all__ = ["ConveyorResource", "conveyor_asset"]


class ConveyorResource(dg.ConfigurableResource):  # type: ignore[misc]
    """Runs Conveyor jobs for assets; ``run_dir``: where each run keeps report.json and its manifest
    (a folder per run, named by Dagster's run id and the asset), none by default."""

    run_dir: str | None = None

    def run(self, context: Any, pipeline: str | None, *overrides: str, **config: Any) -> Any:
        import conveyor

        where = None
        if self.run_dir:
            where = Path(self.run_dir) / f"{context.run.run_id}-{context.asset_key.to_user_string().replace('/', '.')}"
        return conveyor.run(pipeline, *overrides, run_dir=where, **config)


def conveyor_asset(name: str, pipeline: str | None = None, *overrides: str, deps: Sequence[Any] = (), group_name: str | None = None,
                   description: str | None = None, resource_key: str = "conveyor", **config: Any) -> Any:
    """A Dagster asset whose materialization is the Conveyor job ``pipeline`` + ``overrides`` + ``config``."""

    @dg.asset(name=name, deps=list(deps), group_name=group_name, kinds={"conveyor"}, required_resource_keys={resource_key},
              description=description or f"conveyor run {' '.join([*([f'pipeline={pipeline}'] if pipeline else []), *overrides])}")
    def _copy(context):  # unannotated: Dagster reads the annotations, and this module postpones them
        from conveyor.errors import ConveyorError

        resource: ConveyorResource = getattr(context.resources, resource_key)
        try:
            report = resource.run(context, pipeline, *overrides, **config)
        except ConveyorError as exc:  # the step fails with Conveyor's one line and its hint
            raise dg.Failure(description=f"{exc.message}" + (f" (hint: {exc.hint})" if exc.hint else ""),
                             metadata={"exit_code": exc.exit_code}) from None
        verified = report.verification.as_dict() if report.verification is not None else None
        return dg.MaterializeResult(metadata={
            "rows": report.rows, "bytes": report.bytes, "partitions": len(report.results), "seconds": round(report.seconds, 3),
            "target": report.target, "verification": dg.MetadataValue.json(verified) if verified else "none"})

    return _copy

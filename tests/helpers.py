"""Build and run jobs in-process from plain dicts (the CLI tests cover the command itself)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.pipelines.job import JobReport, run_job


def job(source: dict[str, Any], sink: dict[str, Any], strategy: str = "none", strategy_params: dict[str, Any] | None = None,
        max_retries: int = 0, **options: Any) -> JobReport:
    cfg = OmegaConf.create(
        {
            "source": source,
            "sink": sink,
            "strategy": {"type": strategy, **(strategy_params or {})},
            "runtime": {"type": "local", "max_retries": max_retries},
            **options,
        }
    )
    return run_job(build_job(cfg))

"""Build and run jobs in-process from plain dicts (the CLI tests cover the command itself)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.pipelines.job import JobReport, run_job


def job(source: dict[str, Any], sink: dict[str, Any], strategy: str = "none", **options: Any) -> JobReport:
    cfg = OmegaConf.create(
        {
            "source": source,
            "sink": sink,
            "strategy": {"type": strategy},
            "runtime": {"type": "local", "max_retries": 0},
            **options,
        }
    )
    return run_job(build_job(cfg))

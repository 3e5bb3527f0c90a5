"""Test-only sources that misbehave on purpose, shipped to Ray workers by value (cloudpickle).

They live in the tests, not in Conveyor: production code has no test hooks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from conveyor.core import JobOptions, Partition, SourceBase, SourceInfo
from conveyor.errors import TransferError

SCHEMA = pa.schema([("n", pa.int64())])


@dataclass
class SequenceConfig:
    rows: int = 100_000
    batch: int = 10_000
    #: a file whose absence makes the first attempt kill its own process mid-partition
    crash_marker: str = ""
    #: seconds to sleep between batches (to give a fault time to strike mid-COPY)
    pause: float = 0.0
    #: this partition waits on a child process (as the pass-through waits on psql) and fails when the
    #: child dies, as psql's stream does when Ray kills a cancelled worker's children
    wait_on_child: int = -1
    #: this partition fails fatally after pausing its Ray worker's raylet for this long (a busy raylet:
    #: the killed worker's exit then takes long enough for its task to report the failure its killed
    #: child caused, the race seen in CI)
    fail_stalling_raylet: int = -1
    stall_seconds: float = 2.0
    #: a folder where each read leaves a file named as Ray names its task (what the dashboard shows)
    names_to: str = ""


class SequenceSource(SourceBase):
    """The integers [0, rows) in batches of ``batch``; one partition per ``part.index`` shard."""

    config_class = SequenceConfig

    def __init__(self, config: SequenceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def describe(self) -> SourceInfo:
        return SourceInfo(schema=SCHEMA, label="test sequence", estimated_rows=self.config.rows)

    def read(self, part: Partition):
        if part.index == self.config.wait_on_child:
            child = subprocess.run(["sleep", "120"], check=False)
            raise TransferError(f"partition {part.key}: its child process exited {child.returncode}", partition=part.key)
        if part.index == self.config.fail_stalling_raylet:
            time.sleep(1.0)  # the other partition's child is running by now
            raylet = os.getppid()  # Ray's workers are the raylet's children
            assert b"raylet" in Path(f"/proc/{raylet}/cmdline").read_bytes(), "not in a Ray worker"
            subprocess.Popen(["sh", "-c", f"sleep {self.config.stall_seconds}; kill -CONT {raylet}"], start_new_session=True)
            os.kill(raylet, signal.SIGSTOP)
            raise TransferError(f"partition {part.key}: the failure that stops the run", partition=part.key)
        if self.config.names_to:
            import ray

            (Path(self.config.names_to) / ray.get_runtime_context().get_task_name()).write_text(part.key)
        lo_all = self.config.rows * part.index // part.count
        hi_all = self.config.rows * (part.index + 1) // part.count
        for i, lo in enumerate(range(lo_all, hi_all, self.config.batch)):
            hi = min(lo + self.config.batch, hi_all)
            if self.config.crash_marker and i == 2 and not Path(self.config.crash_marker).exists():
                Path(self.config.crash_marker).write_text(str(os.getpid()))
                os._exit(17)  # the worker process dies mid-partition, its COPY unfinished
            if self.config.pause:
                time.sleep(self.config.pause)
            yield pa.record_batch([pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), hi - lo)), lo - 1)], schema=SCHEMA)


def ray_spec(source: dict, sink: dict, strategy: dict, degree: int = 2, load_mode: str = "append", **runtime):
    """A job on the Ray runtime (appending unless told, two retries), for the tests that run on the module's Ray instance."""
    from omegaconf import OmegaConf

    from conveyor.config import build_job

    return build_job(OmegaConf.create({
        "source": source, "sink": sink, "strategy": strategy,
        "runtime": {"type": "ray", "max_retries": 2, **runtime}, "load_mode": load_mode, "degree": degree,
    }))


def with_fault_source(spec, **config):
    """The job with the test's sequence source in place of the configured one."""
    from dataclasses import replace

    source = SequenceSource(SequenceConfig(**config), spec.options)
    return replace(spec, source=source, names={**spec.names, "source": "test-sequence"})

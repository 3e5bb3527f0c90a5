"""An example source plugin: the integers [start, stop) split into `parts` key ranges.

It shows the whole contract a source implements: a config dataclass named by
``config_class``, a constructor taking (config, job options), ``describe`` (schema, estimate,
label) and ``read`` (Arrow batches for one partition); ``SourceBase`` gives the hooks it does not
use (a session, checksums, a native format, ...) their defaults. It serves ``strategy=none`` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from conveyor.core import JobOptions, Partition, SourceBase, SourceInfo, WholeSource
from conveyor.errors import PlanningError

SCHEMA = pa.schema([("n", pa.int64()), ("square", pa.int64())])


@dataclass
class SequenceSourceConfig:
    start: int = 0
    stop: int = 1000


class SequenceSource(SourceBase):
    config_class = SequenceSourceConfig

    def __init__(self, config: SequenceSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def describe(self) -> SourceInfo:
        rows = max(0, self.config.stop - self.config.start)
        return SourceInfo(schema=SCHEMA, label=f"sequence [{self.config.start}, {self.config.stop})", estimated_rows=rows)

    def read(self, part: Partition) -> Iterator[pa.RecordBatch]:
        if not isinstance(part, WholeSource):
            raise PlanningError(f"sequence source cannot read a {part.kind} partition", hint="use strategy=none")
        step = self.options.batch_size
        for lo in range(self.config.start, self.config.stop, step):
            hi = min(lo + step, self.config.stop)
            # a run of ones summed up: the integers lo..hi-1, made by Arrow, not a Python loop
            n = pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), hi - lo)), lo - 1)
            yield pa.record_batch([n, pc.multiply(n, n)], schema=SCHEMA)

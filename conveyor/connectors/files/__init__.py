"""Parquet and CSV files on any fsspec filesystem: sources and sinks.

A source ``path`` is a file, a folder (every file in it with the format's extension) or a
glob. Sinks write one file per partition into a folder, each under a temporary name first
and renamed when whole, so a failed partition leaves no file behind. ``truncate``,
``replace`` and ``create`` write into a staging folder that replaces the folder's files
only when every partition succeeded.
"""

from typing import TYPE_CHECKING

from conveyor.registry import lazy_exports

if TYPE_CHECKING:
    from conveyor.connectors.files.sinks import CsvSink, CsvSinkConfig, FileSinkConfig, ParquetSink, ParquetSinkConfig
    from conveyor.connectors.files.sources import CsvSource, CsvSourceConfig, FileSourceConfig, ParquetSource

__getattr__ = lazy_exports(
    __name__,
    sinks=("CsvSink", "CsvSinkConfig", "FileSinkConfig", "ParquetSink", "ParquetSinkConfig"),
    sources=("CsvSource", "CsvSourceConfig", "FileSourceConfig", "ParquetSource"),
)
__all__ = [
    "CsvSink", "CsvSinkConfig", "CsvSource", "CsvSourceConfig", "FileSinkConfig", "FileSourceConfig",
    "ParquetSink", "ParquetSinkConfig", "ParquetSource",
]

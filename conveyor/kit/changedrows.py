"""A sync run's changed rows as a source that splits itself (``strategy=native``): what the PostgreSQL and MySQL
change feeds' row sources share. Each partition is one chunk of the changed keys (a plain descriptor: the chunk in
the partition's token), read as a plain query source of the connector's own class (``_base``) made by the
connector's ``_chunk``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.core import NativePartition, Partition


class ChunkedRows:
    """Mixin before the connector's source class; the connector sets ``_base`` (that class) and ``_parts`` (the
    partitions, on the driver only) and writes ``_chunk(part) -> (a plain source of the chunk's rows, its partition)``."""

    _base: Any
    _parts: list[NativePartition]

    def _chunk(self, part: Partition) -> tuple[Any, Partition]:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        # handed to the strategy on the driver; not shipped with the source to the tasks (each partition carries its own)
        state = self.__dict__.copy()
        state["_parts"] = []
        return state

    def __copy__(self) -> Any:  # the session's copy (copy.copy would go through __getstate__)
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def native_partitions(self) -> list[NativePartition]:
        return list(self._parts)

    def read(self, part: Partition) -> Iterator[Any]:
        source, whole = self._chunk(part)
        return self._base.read(source, whole)  # type: ignore[no-any-return]

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> Any:
        source, whole = self._chunk(part)
        return self._base.export_native(source, whole, columns)

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        counts = []
        for part in parts:
            source, whole = self._chunk(part)
            got = self._base.count_rows(source, [whole])
            if got is None:
                return None
            counts.append(got[0])
        return counts


__all__ = ["ChunkedRows"]

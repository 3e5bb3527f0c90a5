"""The job's ``columns`` (a subset of the source's, in that order) and ``rename`` ({source column: name in the
target}): applied to the source's schema and to every batch it reads (Arrow's select and rename: zero-copy; a source
with ``selecting(columns)``, PostgreSQL, reads only those columns: a value it would refuse in a column left out does
not stop the job), so
every sink, every strategy and every runtime sees the projected source, and any sink maps or creates its columns
from it as from any source.

What the projection changes besides: the source's native stream (the PostgreSQL pass-through) is not offered
(it carries the source's columns as they are: the rows take the Arrow path), but its column records are, renamed (a
sink of the same database makes the columns with the source's own types); a checksum both databases compute is
not offered either (``verify=checksum`` then compares a staged load row for row); the primary key is kept, renamed,
when every one of its columns is selected; a table's definition and foreign keys are not carried (their names are
the source's).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from conveyor.core import SentBatches
from conveyor.errors import ConfigError


class Projected:
    """A source with the job's ``columns`` and ``rename`` applied (everything else is the source's own)."""

    def __init__(self, inner: Any, columns: tuple[str, ...], rename: dict[str, str]) -> None:
        self.inner, self.columns, self.rename = inner, columns, rename

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "columns", "rename"):  # pickling and copying ask before inner is set
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _names(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(the source columns read, in order; their names in the batches), each problem refused by name."""
        chosen = list(self.columns) or list(names)
        left = [c for c in self.rename if c not in chosen and (self.columns or c in names)]
        if left:
            raise ConfigError(f"rename: {', '.join(left)} is not among the columns read", key="rename")
        unknown = [c for c in [*chosen, *self.rename] if c not in names]
        if unknown:
            key = "columns" if any(c in self.columns for c in unknown) else "rename"
            raise ConfigError(f"{key}: the source has no column {', '.join(dict.fromkeys(unknown))}", key=key,
                              hint=f"its columns: {', '.join(names)}")
        out = [self.rename.get(c, c) for c in chosen]
        doubled = sorted({n for n in out if out.count(n) > 1})
        if doubled:
            raise ConfigError(f"rename: two columns would be named {', '.join(doubled)}", key="rename")
        return chosen, out

    def describe(self) -> Any:
        import pyarrow as pa

        info = self.inner.describe()
        schema = info.schema
        chosen, out = self._names(schema.names)
        projected = pa.schema([schema.field(c).with_name(n) for c, n in zip(chosen, out)], metadata=schema.metadata)
        key = tuple(self.rename.get(c, c) for c in info.primary_key) if set(info.primary_key) <= set(chosen) else ()
        return dataclasses.replace(info, schema=projected, native=self._native(info.native, chosen, out), checksums=False,
                                   primary_key=key, foreign_keys=(), definition=None)

    @staticmethod
    def _native(native: Any, chosen: list[str], out: list[str]) -> Any:
        """The source's column records of the columns chosen, under their names in the target (a sink of the same database
        makes and checks the columns with the source's own types: json stays json, inet inet), and no stream to pass
        through (it carries the source's columns as they are)."""
        if native is None:
            return None
        records = {getattr(c, "name", None): c for c in native.columns}
        columns = tuple(dataclasses.replace(records[c], name=n) for c, n in zip(chosen, out)
                        if c in records and dataclasses.is_dataclass(records[c]))
        return dataclasses.replace(native, columns=columns if len(columns) == len(chosen) else (), format=None,
                                   why_not="the job's columns / rename take the rows the Arrow path", counts=False)

    def _batches(self, batches: Any) -> Iterator[Any]:
        for batch in batches:
            chosen, out = self._names(batch.schema.names)
            yield batch.select(chosen).rename_columns(out)

    def read(self, part: Any) -> Any:
        got = self.inner.read(part)
        if not isinstance(got, SentBatches):
            return self._batches(got)

        def relayed(sent: SentBatches) -> Iterator[Any]:
            yield from self._batches(got)
            sent.sent = got.sent  # the source's own count of what it sent, once every batch is read

        return SentBatches(relayed)

    @contextlib.contextmanager
    def session(self) -> Iterator[Projected]:
        with self.inner.session() as shipped:
            yield Projected(shipped, self.columns, self.rename)

    def keeping(self, kinds: tuple[str, ...]) -> Projected:
        return Projected(self.inner.keeping(kinds), self.columns, self.rename)


def projected(source: Any, columns: list[str] | None, rename: dict[str, str] | None) -> Any:
    """The source, projected where the job names ``columns`` or ``rename`` (else as it is)."""
    if not columns and not rename:
        return source
    if source is not None and getattr(source, "many", lambda: False)():
        raise ConfigError("columns / rename with source.tables: not built (one table's columns are not another's)", key="columns")
    selecting = getattr(source, "selecting", None)  # a source that reads only the columns chosen (PostgreSQL): the rest are never read
    if columns and selecting is not None:
        source = selecting(tuple(columns))
    return Projected(source, tuple(columns or ()), dict(rename or {}))

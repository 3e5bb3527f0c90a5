"""Whether a table's finished partitions still hold the rows a stopped run read: what lets ``resume``
read only the rest, or refuse.

A run keeps a *mark* of the snapshot its partitions read (:func:`mark`, on the connection that
exports it): the snapshot's bounds and the transactions then in progress, subtransactions included
(every transaction id holds a lock on itself until its top-level transaction ends, which
``pg_locks`` shows; ``txid_current_snapshot`` lists top-level ones only), and the table's files.

A resumed run, in its own snapshot, reads each finished partition once (:func:`changed`): a row
version that snapshot did not see (its ``xmin``: inserted, or the new version of an update, since)
or fewer rows than were loaded (deleted, or moved out by an update) means the partition no longer
holds what the target has. None of either means it holds exactly the rows loaded: every row version
in it existed then, and there are as many. Then the target, finished partitions and the rest read
now, equals the source as of the resumed run's snapshot. A ctid partition is a page range: a table
rewritten since (VACUUM FULL, CLUSTER) keeps its row versions in other pages, so its files are compared too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.core import PageRange, Partition

_WRAP = 1 << 32


def _widen(xid: int, ref: int) -> int:
    """A 32-bit transaction id as the 64-bit one at or before ``ref`` (a 64-bit id) that it ends in."""
    full = ref - ref % _WRAP + xid
    return full - _WRAP if full > ref else full


def mark(con: Any, table: str | None = None) -> dict[str, Any]:
    """The snapshot of ``con``'s transaction: (xmin, xmax, the transactions then in progress) and, for a
    ``table`` (an SQL literal of its name), its files and its partitions' (oid -> relfilenode)."""
    files = (f", array(SELECT c.oid::text || ':' || c.relfilenode FROM pg_class c WHERE c.oid = {table}::regclass "
             f"OR c.oid IN (SELECT relid FROM pg_partition_tree({table}::regclass)))") if table else ""
    snap, locked, *nodes = con.execute("SELECT txid_current_snapshot()::text, array(SELECT transactionid::text::bigint FROM pg_locks "
                                       f"WHERE locktype = 'transactionid' AND transactionid IS NOT NULL){files}").fetchone()
    xmin, xmax, xip = snap.split(":")
    low, high = int(xmin), int(xmax)
    running = {int(x) for x in xip.split(",") if x} | {w for w in (_widen(int(x), high) for x in locked or ()) if low <= w < high}
    out: dict[str, Any] = {"xmin": low, "xmax": high, "running": sorted(running)}
    if nodes:
        out["files"] = dict(n.split(":") for n in nodes[0] or ())
    return out


def new_version_sql(seen: Mapping[str, Any], now_xmax: int) -> str:
    """A condition on a row: its version is one the marked snapshot did not see (inserted since, or
    by a transaction then in progress). 1 and 2 are the bootstrap and frozen ids: always seen."""
    base = now_xmax - now_xmax % _WRAP
    raw = "xmin::text::bigint"
    full = f"(CASE WHEN {raw} + {base} > {now_xmax} THEN {raw} + {base - _WRAP} ELSE {raw} + {base} END)"
    running = seen.get("running") or []
    also = f" OR {full} = ANY('{{{','.join(str(int(x)) for x in running)}}}'::bigint[])" if running else ""
    return f"({raw} > 2 AND ({full} >= {int(seen['xmax'])}{also}))"


def changed(source: Any, seen: Mapping[str, Any], parts: Sequence[Partition], rows: Sequence[int]) -> list[str]:
    """Each partition of ``parts`` that no longer holds the ``rows`` it held under the mark ``seen``,
    read in the source's snapshot (empty: none changed)."""
    now_xmax = int(source._rows("SELECT txid_snapshot_xmax(txid_current_snapshot())")[0][0])
    if now_xmax - int(seen["xmax"]) >= _WRAP // 2:
        return [f"over {_WRAP // 2:,} transactions ran since the run it resumes: its row versions cannot be told apart any more"]
    out = []
    if any(isinstance(p, PageRange) for p in parts) and seen.get("files") is not None:
        if (source.change_mark() or {}).get("files") != seen["files"]:
            out.append("the table was rewritten since (VACUUM FULL, CLUSTER or TRUNCATE): its page ranges now hold other rows")
    fresh = new_version_sql(seen, now_xmax)
    for part, loaded, (now, new) in zip(parts, rows, source.count_where(parts, fresh)):
        if new:
            out.append(f"{part.key}: {new:,} rows inserted or updated into it since")
        elif now != loaded:
            out.append(f"{part.key}: {now:,} rows now, {loaded:,} loaded (rows deleted, or moved out by updates, since)")
    return out

"""The staging lifecycle every table sink shares (PostgreSQL, DuckDB, ADBC), written once.

append writes into the target, one transaction per partition. truncate, create and replace
write into a staging table; :meth:`StagedSink.finalize` swaps it in with one transaction
(truncate: empty the target and copy the staged rows in; create / replace: drop the old target,
rename the stage) and :meth:`StagedSink.abort` drops it, so a failed run leaves the target as it
was. A connector gives its SQL spelling and how it runs statements in one transaction.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conveyor.core import SinkBase, SinkPlan, WriteStats
from conveyor.errors import SchemaError, VerificationError


def check_mode(mode: str, exists: bool, where: str, on: str = "") -> None:
    """Refuse, before anything is created, a load mode the target's existence rules out."""
    if mode in ("append", "truncate", "merge") and not exists:
        raise SchemaError(f"{where} does not exist" + (f" on {on}" if on else ""),
                          hint="create it first, or use load_mode=create or replace")
    if mode == "create" and exists:
        raise SchemaError(f"{where} already exists", hint="use load_mode=replace, truncate or append")


def staged_path(mode: str, how: str) -> str:
    """The data path of a table sink whose non-append loads go through a staging table, for the plan:
    ``how`` the rows go in (the sink's own words)."""
    if mode == "append":
        return f"{how}, one transaction per partition"
    last = "merged into the target" if mode == "merge" else "made the target's"
    return f"{how} into a staging table, {last} in one transaction at the end"


def check_taken(where: str, taken: int, staged: int) -> None:
    """The staged rows copied into the target must all be taken (a trigger or rule on it can drop rows
    without an error): checked before the swap commits."""
    if taken != staged:
        raise VerificationError(f"verification failed for {where}: it took {taken:,} of the {staged:,} staged rows "
                                "(a trigger or rule on it skipped the others)",
                                hint="the target was not changed; see its triggers and rules (or load into a table without them)")


def swap_steps(mode: str, target: str, stage: str, new_name: str, columns: Sequence[str], empty: str = "DELETE FROM",
               drop_old: bool = True, overriding: str = "") -> list[str]:
    """The statements that make a staged load the target's content, in one transaction.

    ``target`` and ``stage`` are qualified names, ``new_name`` the target's bare (quoted) name the
    stage is renamed to, ``columns`` quoted column names; ``empty`` empties the target for truncate
    (``TRUNCATE`` where the engine has it); ``overriding``: the clause that lets an insert write identity columns'
    values (PostgreSQL's ``OVERRIDING SYSTEM VALUE``: a GENERATED ALWAYS identity takes the source's values)."""
    if mode == "truncate":
        cols = ", ".join(columns)
        return [f"{empty} {target}", f"INSERT INTO {target} ({cols}) {overriding}SELECT {cols} FROM {stage}", f"DROP TABLE {stage}"]
    drop = [f"DROP TABLE IF EXISTS {target}"] if mode == "replace" and drop_old else []
    return [*drop, f"ALTER TABLE {stage} RENAME TO {new_name}"]


class StagedSink(SinkBase):
    """finalize / abort for a sink whose non-append loads go through a staging table.

    A subclass sets ``self.table`` (the target's bare name) and implements :meth:`_qualified`,
    :meth:`_quote`, :meth:`_in_one_transaction` and :meth:`_drop`."""

    table: str
    #: how the engine empties a table for truncate
    empty = "DELETE FROM"

    def _qualified(self, table: str | None = None) -> str:
        raise NotImplementedError

    def _quote(self, name: str) -> str:
        raise NotImplementedError

    def _in_one_transaction(self, plan: SinkPlan, steps: list[str], taken: Callable[[int], None] | None = None) -> None:
        """Run ``steps`` in one transaction; ``taken`` hears the rows the INSERT step (truncate's copy of the
        staged rows) says it inserted, before the commit, and raises to roll it back."""
        raise NotImplementedError

    def _drop(self, table: str) -> None:
        raise NotImplementedError

    @staticmethod
    def staged(plan: SinkPlan, table: str) -> bool:
        return plan.write_target != table

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        if not self.staged(plan, self.table):
            return
        steps = swap_steps(plan.load_mode, self._qualified(), self._qualified(plan.write_target), self._quote(self.table),
                           [self._quote(c) for c in plan.columns], self.empty)
        staged = sum(r.rows for r in results)
        where = f"{self._qualified()}"
        self._in_one_transaction(plan, steps, taken=(lambda rows: check_taken(where, rows, staged)) if plan.load_mode == "truncate" else None)

    def abort(self, plan: SinkPlan) -> None:
        if self.staged(plan, self.table):
            self._drop(plan.write_target)


# --- staging tables of runs that are gone ---------------------------------------------------------


def stage_label(run_id: str, target: str) -> str:
    """What a staging table's comment says: whose it is, for which target, since when."""
    return json.dumps({"conveyor": "staging table", "run_id": run_id, "target": target,
                       "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})


@dataclass(frozen=True)
class Stage:
    """A staging table found in a target's schema (or database), and whether its run still holds its guard."""

    schema: str
    name: str
    run_id: str
    target: str
    started: str
    bytes: int
    active: bool

    @classmethod
    def read(cls, schema: str, name: str, run_id: str, comment: str | None, size: int, active: bool) -> Stage:
        try:
            note = json.loads(comment) if comment else {}
        except ValueError:
            note = {}
        return cls(schema, name, run_id, note.get("target", ""), note.get("started", ""), size, active)

    def describe(self) -> str:
        state = "in use by a running job" if self.active else "stale (its run is gone)"
        return (f"{self.schema}.{self.name}: run {self.run_id}, target {self.target or '?'}, started {self.started or '?'}, "
                f"{self.bytes / 1e6:,.1f} MB, {state}")

"""Whole-database migrations (``migrate.schema=true`` on a sync job): the two contracts a migration adds to a sync's.

A source that can **export its schema** (:class:`SchemaExport`) writes the definitions of its database's objects as
a script the same kind of server runs (:class:`SchemaScript`: PostgreSQL's ``pg_dump`` sections), in a snapshot the
sync's first load reads, and says its sequences' values. A sink that can **import a schema** (:class:`SchemaImport`)
runs such a script in one transaction with a record of the migration's step beside it (so a rerun knows what is
done), sets sequences, and applies a sync's changes as a replica would (the target's triggers and foreign key
actions do not fire again for rows the source's own already changed).

``conveyor.pipelines.migrate`` runs a migration through these and the sync's contracts alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

#: a migration's steps, in order, as the target records them
STEPS = ("schema", "indexed", "done")


@dataclass
class MigrateConfig:
    #: a sync that moves the whole database: the source's definitions first (its schema objects, in the first load's
    #: snapshot), its indexes, constraints and triggers after the load, sequences set
    schema: bool = False
    #: with the objects' owners and grants (the target must have the roles; false: the target's user owns everything)
    owners: bool = True
    #: the application's writes to the source have stopped: apply the rest, set sequences, verify every table, finish
    cutover: bool = False
    #: the dump program (null: one of the target server's version found on this machine, able to read the source)
    pg_dump: str | None = None


@dataclass(frozen=True)
class SchemaScript:
    """A section of a database's definitions (``pre-data``: schemas, types, functions, tables, views, sequences;
    ``post-data``: indexes, constraints, triggers, rules, policies) as the source wrote it, and what it needs of the
    target: the roles that own objects or hold grants, the extensions it creates."""

    section: str
    sql: str
    roles: frozenset[str] = frozenset()
    extensions: frozenset[str] = frozenset()
    #: the objects it makes, by kind (``{"TABLE": 12, "FUNCTION": 3, ...}``): said in the run's lines and report
    objects: dict[str, int] = field(default_factory=dict)
    #: what of the source's definitions the script leaves out, and how often (``{"column option pg_attver": 28}``: an
    #: option only the source's server knows): said in the run's lines and report
    left_out: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        made = ", ".join(f"{n} {kind.lower()}" for kind, n in sorted(self.objects.items(), key=lambda kv: (-kv[1], kv[0]))) or "nothing"
        return made + "".join(f"; left out: {what} ({n}x, the target's server does not know it)" for what, n in self.left_out.items())


@runtime_checkable
class SchemaExport(Protocol):
    """A source whose database's definitions can be written as a script (PostgreSQL: ``pg_dump``)."""

    def export_schema(self, section: str, snapshot: Any, owners: bool, tool: str | None, target_version: int) -> SchemaScript:
        """``section`` (``pre-data`` or ``post-data``) of the database's definitions as of ``snapshot`` (the sync's
        first position's; None: now), for a target server of ``target_version``; ``owners``: with ownership and grants;
        ``tool``: the dump program (None: found)."""
        ...

    def sequence_values(self) -> dict[str, int]:
        """Every sequence's last value (sequences never used are left out), by qualified name."""
        ...


@runtime_checkable
class SchemaImport(Protocol):
    """A sink that runs a :class:`SchemaScript` and keeps a migration's step."""

    def server_version(self) -> int:
        """The target server's (major) version, which the source writes its definitions for."""
        ...

    def import_schema(self, script: SchemaScript, slot: str, step: str, later: SchemaScript | None = None, jobs: int = 1) -> None:
        """Run ``script`` in one transaction (checked first: every role and extension it needs is on the target, refused
        by name) and record ``step`` for the migration ``slot`` in it; ``later`` is kept with the step for the next
        one (the post-data section taken in the same snapshot as the pre-data). ``jobs`` > 1: the script's indexes and
        keys are built that many at once first, each committed by itself and skipped where a stopped run made it."""
        ...

    def migration_step(self, slot: str) -> tuple[str | None, SchemaScript | None]:
        """The step the migration ``slot`` recorded (None: none yet), and the script it kept for the next one."""
        ...

    def set_sequences(self, values: dict[str, int]) -> int:
        """Each sequence at least at its value in ``values`` (``setval``, never moved back); returns how many moved."""
        ...

    def as_replica(self) -> Any:
        """This sink with a sync's applies made as a replica's (PostgreSQL: ``session_replication_role = replica``)."""
        ...

    def empty_tables(self, tables: Sequence[tuple[str, str]]) -> None:
        """The migration's tables (schema, name) emptied in one transaction, with their loads' commit markers (a first load
        that stopped is made again in a new snapshot)."""
        ...

    def forget_migration(self, slot: str, tables: Sequence[tuple[str, str]] = ()) -> list[str]:
        """The migration's own records removed from the target (after its cutover): its tables' loads' commit markers,
        Conveyor's tables in their schemas that hold nothing any more (markers, sync states); what was dropped."""
        ...


__all__ = ["STEPS", "MigrateConfig", "SchemaExport", "SchemaImport", "SchemaScript"]

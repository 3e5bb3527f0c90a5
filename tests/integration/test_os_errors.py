"""What the operating system refuses is named with its own exit code and a hint: a read-only folder (exit 3, like a
target that cannot be reached), a full disk (exit 5, a transfer that could not finish), a host name that does not
resolve (exit 3). On the main this started from, the first two exited 4 (a schema error) without a hint, a full DuckDB
file said only "cannot rollback - no transaction is active" (its COMMIT's failure hidden by the ROLLBACK after it), and
an unresolvable host exited 5.

The read-only and full file systems are real: tmpfs mounts, made here (root only: skipped otherwise) and removed after."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import conveyor
from conveyor.errors import ConnectError, TransferError


@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    table = pa.table({"id": pa.array(range(20_000), pa.int64()), "name": pa.array([f"name {i}" * 3 for i in range(20_000)], pa.string_view())})
    pq.write_table(table, tmp_path / "rows.parquet")
    return tmp_path / "rows.parquet"


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@needs_root
def test_a_read_only_folder_and_a_full_disk_are_named_with_their_exit_codes(rows: Path, tmp_path: Path) -> None:
    source = {"type": "parquet", "path": str(rows)}
    with _tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        with pytest.raises(ConnectError, match="cannot write there: .*Read-only file system") as caught:
            conveyor.run(None, "source=parquet", "sink=parquet", "strategy=none", source=source, sink={"path": str(ro / "out")}, load_mode="create")
        assert caught.value.exit_code == 3 and "writable" in caught.value.hint
    with _tmpfs(tmp_path / "full", "size=64k") as full:
        for sink, target, said in (("parquet", {"path": str(full / "out")}, "the disk is full"),
                                   ("duckdb", {"database": str(full / "x.duckdb"), "table": "t"}, "No space left on device")):
            with pytest.raises(TransferError, match=said) as caught:
                conveyor.run(None, "source=parquet", f"sink={sink}", "strategy=none", source=source, sink=target, load_mode="create")
            assert caught.value.exit_code == 5 and "free space" in caught.value.hint, (sink, caught.value.hint)


def test_a_host_that_does_not_resolve_is_a_connection_error(tmp_path: Path) -> None:
    with pytest.raises(ConnectError, match="failed to resolve host 'nohost.invalid'|could not translate host name") as caught:
        conveyor.run(None, "source=postgres", "sink=parquet", source={"host": "nohost.invalid", "table": "t"}, sink={"path": str(tmp_path / "o")})
    assert caught.value.exit_code == 3


def test_a_string_view_column_is_written_to_csv(rows: Path, tmp_path: Path) -> None:
    """A Parquet file of string_view columns (tpchgen-cli writes them) into CSV: refused, "the CSV writer cannot write it"."""
    conveyor.run(None, "source=parquet", "sink=csv", "strategy=none", source={"path": str(rows)}, sink={"path": str(tmp_path / "csv")},
                 load_mode="create")
    back = pa.concat_tables([pacsv.read_csv(f) for f in sorted((tmp_path / "csv").glob("*.csv"))])
    assert back.column("name").to_pylist() == pq.read_table(rows).column("name").to_pylist()

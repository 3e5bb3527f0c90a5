"""What keeps a job process's memory down by default: the allocator the conveyor command gives
pyarrow, and the parquet_to_postgres pipeline's read-ahead (make bench's memory group measures both
against DuckDB's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conveyor.config import build_job
from conveyor.submit import compose


def _pool_after_main(env: dict[str, str]) -> str:
    code = ("import sys; from conveyor.cli import main; assert main(['plugins']) == 0; "
            "import pyarrow; print(pyarrow.default_memory_pool().backend_name)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


def test_the_conveyor_command_gives_pyarrow_the_system_allocator_unless_told_otherwise() -> None:
    """On main a conveyor process allocated Arrow memory with pyarrow's default (mimalloc here), which
    kept 40-50 MB more at the peak of Parquet -> PostgreSQL and PostgreSQL -> Parquet on lineitem SF1."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    assert _pool_after_main(env) == "system"
    assert _pool_after_main({**env, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}) == "mimalloc"  # the user's choice stands


@pytest.mark.parametrize("runtime", ["ray", "local"])
def test_parquet_to_postgres_reads_two_batches_ahead_on_either_runtime(runtime: str) -> None:
    spec = build_job(compose(["pipeline=parquet_to_postgres", "source.path=x", "sink.table=t", f"runtime={runtime}"]))
    assert spec.runtime.config.prefetch_batches == 2
    assert spec.options.batch_size == 16384


def _after_main(env: dict[str, str]) -> tuple[str, int]:
    """OPENBLAS_NUM_THREADS after main(), and the process's threads once pyarrow (and so numpy) is imported."""
    code = ("import os; from conveyor.cli import main; assert main(['plugins']) == 0; import pyarrow; "
            "print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    value, threads = res.stdout.strip().splitlines()[-1].split()
    return value, int(threads)


def test_the_conveyor_command_starts_no_openblas_threads_unless_told_to() -> None:
    """On main numpy's OpenBLAS (imported by pyarrow) started a spinning thread per further core in
    every conveyor process: 0.10 CPU-s taken from the database servers on the same two cores."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")}
    value, threads = _after_main(env)
    assert value == "1"
    assert threads == _after_main({**env, "OPENBLAS_NUM_THREADS": "1"})[1]
    told, more = _after_main({**env, "OPENBLAS_NUM_THREADS": "2"})
    assert told == "2"  # the user's choice stands
    if (os.cpu_count() or 1) >= 2:  # the count sees OpenBLAS's threads (a one-core machine starts none)
        assert more > threads

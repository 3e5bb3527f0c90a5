"""A third-party plugin package, installed with pip, found through its entry point and run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import REPO

PLUGIN = REPO / "tests" / "plugins" / "conveyor-example"


def pip_install(package: Path, into: Path) -> dict[str, str]:
    """``package`` installed with pip into a folder of its own (not the suite's venv, which the other xdist worker's
    processes are reading: a package appearing and going there made their runs fail); the environment that finds it,
    entry points and all."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(into),
                           str(package)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"PYTHONPATH": str(into)}


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory):
    env = pip_install(PLUGIN, tmp_path_factory.mktemp("site"))
    yield PLUGIN, env


def test_plugins_lists_the_third_party_source(installed_plugin, cli) -> None:
    res = cli("plugins", env=installed_plugin[1])
    assert res.code == 0
    line = next(line for line in res.out.splitlines() if line.strip().startswith("sequence"))
    assert "conveyor_example:SequenceSource" in line and "[conveyor-example]" in line


def test_a_job_runs_with_the_third_party_source_by_name(installed_plugin, cli, tmp_path: Path) -> None:
    env = installed_plugin[1]
    """No --config-dir: the package's `conveyor.configs` entry point puts its YAML on Hydra's search path."""
    res = cli("run", "source=sequence", "source.stop=250000", "strategy=none",
              "sink=parquet", f"sink.path={tmp_path}/out", "load_mode=create", "batch_size=50000", env=env)
    assert res.code == 0, res.err
    table = pq.read_table(tmp_path / "out")
    assert table.num_rows == 250000
    n = table.column("n").to_pylist()
    assert sorted(n) == list(range(250000))
    assert table.column("square").to_pylist()[:4] == [v * v for v in n[:4]]
    # its defaults come from its dataclass, and `conveyor run --help` lists it
    shown = cli("run", "source=sequence", "--cfg", "job", env=env)
    assert shown.code == 0 and "  start: 0\n  stop: 1000" in shown.out
    assert "sequence" in next(line for line in cli("run", "--help", env=env).out.splitlines() if line.startswith("source:"))


def test_the_plugins_own_contract_tests_pass(installed_plugin) -> None:
    """The example package runs Conveyor's contract kit (a pytest plugin) on its source in its own tests."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=installed_plugin[0],
                          env={**os.environ, **installed_plugin[1]},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout


def test_conveyor_new_connector_makes_a_package_that_installs_tests_and_runs(cli, tmp_path: Path) -> None:
    """The template: entry points, config YAML extending the dataclass, contract tests; installed, it runs by name.
    With --sink, a sink too (on the main this started from there was none), run by name as the job's sink."""
    made = cli("new", "connector", "scaffolded", "--dir", str(tmp_path), "--sink")
    assert made.code == 0, made.err
    package = tmp_path / "conveyor-scaffolded"
    env = pip_install(package, tmp_path / "site")
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=package, env={**os.environ, **env},
                           capture_output=True, text=True, timeout=300)
    # the contract checks (3) and the sink suite's rules for create and append (4; the other modes and the read-back skipped)
    assert tests.returncode == 0 and "7 passed, 5 skipped" in tests.stdout, tests.stdout[-3000:]
    res = cli("run", "source=scaffolded", "source.rows=70000", "strategy=none", "sink=parquet", f"sink.path={tmp_path}/out",
              "load_mode=create", "runtime=local", "batch_size=30000", env=env)
    assert res.code == 0, res.err
    assert sorted(pq.read_table(tmp_path / "out").column("id").to_pylist()) == list(range(70000))
    res = cli("run", "source=scaffolded", "source.rows=5000", "strategy=none", "sink=scaffolded", f"sink.path={tmp_path}/own",
              "load_mode=create", "runtime=local", env=env)
    assert res.code == 0 and "verify=count: ok" in res.out, res.err
    assert "optional-dependencies" in (package / "pyproject.toml").read_text()  # its tests' own dependencies
    again = cli("new", "connector", "scaffolded", "--dir", str(tmp_path))
    assert again.code == 2 and "already exists" in again.err

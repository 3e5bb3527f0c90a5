"""The CLI behaves like its neighbours: --version, --help on every command, argparse's option forms,
Hydra's app named conveyor (log file, help, shell completion)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conveyor import __version__
from tests.helpers import BIN, run_cli


def test_version(cli) -> None:
    res = cli("--version")
    assert res.code == 0 and res.out.strip() == f"conveyor {__version__}"


@pytest.mark.parametrize("command, options", [
    ("serve", ["--host", "--port", "--name", "--token-env"]),
    ("submit", ["--address", "--follow", "--no-wait", "--timeout"]),
    ("clean", ["--drop"]),
    ("report", ["multirun_dir"]),
    ("new", ["connector"]),
])
def test_every_command_has_help(cli, command: str, options: list[str]) -> None:
    res = cli(command, "--help")
    assert res.code == 0, res.err
    assert f"usage: conveyor {command}" in res.out
    for option in options:
        assert option in res.out


def test_top_level_help_lists_every_command(cli) -> None:
    res = cli("--help")
    assert res.code == 0
    for command in ("run", "plan", "plugins", "submit", "serve", "clean", "report", "new"):
        assert f"    {command}" in res.out


@pytest.mark.parametrize("form", [["--timeout", "5"], ["--timeout=5"]])
def test_option_values_in_both_forms(form: list[str]) -> None:
    from conveyor.cli import parse_command

    ns = parse_command(["submit", *form, "pipeline=demo", "--no-wait", "degree=2"])
    assert ns.timeout == 5.0 and ns.wait is False and ns.overrides == ["pipeline=demo", "degree=2"]


def test_an_unknown_option_is_one_clear_line(cli) -> None:
    res = cli("serve", "--prot", "8815")
    assert res.code == 2 and res.err.splitlines() == ["error: conveyor serve: unrecognized arguments: --prot",
                                                      "hint: conveyor serve --help lists the options"]


def test_hydra_knows_the_app_as_conveyor(cli, tpch_orders: Path, tmp_path: Path) -> None:
    res = cli("run", "--help")
    assert res.code == 0 and "cli" not in res.out.split() and "conveyor_defaults" not in res.out
    assert "source: adbc, clickhouse, csv, delta, duckdb, flight, iceberg, mysql, parquet, postgres" in res.out
    res = run_cli("run", "pipeline=demo", f"source.path={tpch_orders}", f"sink.database={tmp_path}/d.duckdb", "runtime=local",
                  f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.code == 0, res.err
    assert (tmp_path / "run" / "conveyor.log").exists() and not (tmp_path / "run" / "cli.log").exists()
    assert json.loads((tmp_path / "run" / "report.json").read_text())["status"] == "succeeded"


def test_shell_completion_registers_conveyor_and_answers_its_queries(tmp_path: Path) -> None:
    """Hydra's bash script completes `conveyor` and asks `conveyor -sc query=bash` with the whole line."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    script = subprocess.run([str(BIN / "conveyor"), "run", "-sc", "install=bash"], capture_output=True, text=True, env=env, timeout=60)
    assert script.returncode == 0, script.stderr
    assert script.stdout.rstrip().splitlines()[-1].endswith("hydra_bash_completion conveyor")

    def query(line: str) -> list[str]:
        proc = subprocess.run([str(BIN / "conveyor"), "-sc", "query=bash"], capture_output=True, text=True, timeout=60,
                              env={**env, "COMP_LINE": line, "COMP_POINT": str(len(line))})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert "plan" in query("conveyor pl") and "run" in query("conveyor ")
    assert "source=" in query("conveyor run sou")
    assert "sink=postgres" in query("conveyor plan sink=")
    # the script itself, run by bash, completes a line
    probe = f"""{script.stdout}
COMP_LINE='conveyor run strategy=' COMP_POINT=22 COMP_CWORD=2
hydra_bash_completion
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert "strategy=ctid" in out.stdout.split(), out.stdout + out.stderr


def test_off_a_terminal_the_summary_cuts_no_path_and_pads_no_line(cli, tpch_orders: Path, tmp_path: Path) -> None:
    """A run's output in a log or a pipe: every path whole on its line (it was cut with an ellipsis, and the title
    wrapped mid-name, at 160 columns), and no line padded with spaces to a width."""
    deep = tmp_path / ("a_folder_with_a_long_name_" * 4) / ("and_a_second_one_as_long_" * 4)
    deep.mkdir(parents=True)
    database = deep / "a_database_file_with_a_long_name_too.duckdb"
    files = sorted(tpch_orders.iterdir())
    res = cli("run", "source=parquet", f"source.path={files[0]}", "sink=duckdb", f"sink.database={database}",
              "sink.table=orders_with_a_long_table_name", "load_mode=create", "runtime=local")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert any(f"({database}:main.orders_with_a_long_table_name)" in line for line in lines), res.out
    assert any(str(files[0]) in line for line in lines) and "…" not in res.out, res.out
    assert not [line for line in lines if line != line.rstrip()], res.out

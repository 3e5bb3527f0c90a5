"""Hydra's run-or-sweep decision, read from the command line where no config can set it (one
composition of the config per run instead of two), and from the configs wherever one could."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conveyor import cli as conveyor_cli
from conveyor import clihydra
from tests.helpers import REPO


def _groups() -> list[str]:
    return [f"{kind}={p.stem}" for kind in ("pipeline", "source", "sink", "strategy", "runtime")
            for p in sorted((REPO / "configs" / kind).glob("*.yaml"))]


def test_no_shipped_config_sets_hydra_mode() -> None:
    """What lets a plain run skip Hydra's first composition: none of Conveyor's configs (every
    pipeline, every plugin's) chooses run or sweep."""
    from hydra import compose, initialize_config_module

    from conveyor.config import hydra_overrides

    choices = _groups()
    assert len(choices) >= 30
    with initialize_config_module(config_module="conveyor.configs", version_base="1.3"):
        for choice in [None, *choices]:
            cfg = compose(config_name="config", overrides=hydra_overrides([choice] if choice else []), return_hydra_config=True)
            assert cfg.hydra.mode is None, choice


@pytest.mark.parametrize(("flags", "overrides", "expected"), [
    ([], ["pipeline=demo", "degree=4", "hydra.run.dir=/tmp/x", "hydra/job_logging=none"], True),
    (["-m"], ["strategy=none,files"], True),
    (["--config-dir", "mine"], ["pipeline=mine"], False),
    (["--config-dir=mine"], ["pipeline=mine"], False),
    (["--config-path=mine"], [], False),
    (["-cdmine"], [], False),
    (["--cfg", "job"], ["pipeline=demo"], True),
    (["-cn", "other"], [], False),
    ([], ["hydra.mode=MULTIRUN"], False),
    ([], ["+hydra.mode=MULTIRUN"], False),
    ([], ["hydra.searchpath=[file://mine]"], False),
    ([], ["hydra={mode: MULTIRUN}"], False),
])
def test_which_runs_take_the_mode_from_the_command_line(flags: list[str], overrides: list[str], expected: bool) -> None:
    assert clihydra._mode_is_the_command_lines(flags, overrides) is expected


def _compositions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from hydra._internal.hydra import Hydra

    seen: list[str] = []
    real = Hydra.compose_config

    def counted(self, config_name, overrides, run_mode, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(str(run_mode))
        return real(self, config_name, overrides, run_mode, *args, **kwargs)

    monkeypatch.setattr(Hydra, "compose_config", counted)
    return seen


def test_a_plain_run_composes_its_config_once(monkeypatch: pytest.MonkeyPatch, tpch_orders: Path, tmp_path: Path) -> None:
    """On main every run composed the whole config twice (Hydra's get_mode, then the run): 0.06-0.1 s
    of a CLI job here. A user's config directory still gets Hydra's own two."""
    seen = _compositions(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["conveyor"])
    assert conveyor_cli.main(["plan", "pipeline=demo", f"source.path={tpch_orders}"]) == 0
    assert seen == ["RunMode.RUN"]
    seen.clear()
    (tmp_path / "mine").mkdir()
    assert conveyor_cli.main(["plan", "--config-dir", str(tmp_path / "mine"), "pipeline=demo", f"source.path={tpch_orders}"]) == 0
    assert seen == ["RunMode.MULTIRUN", "RunMode.RUN"]  # get_mode's, then the run's
    from hydra._internal.hydra import Hydra

    assert Hydra.get_mode.__qualname__ == "Hydra.get_mode"  # Hydra's own again after the run


def test_hydra_mode_set_by_an_override_or_a_users_config_still_sweeps(cli, tpch_orders: Path, tmp_path: Path) -> None:
    """hydra.mode=MULTIRUN without -m sweeps, from the command line and from a config of the
    user's (--config-dir): those runs keep Hydra's first composition, which reads it."""
    db = tmp_path / "s.duckdb"
    res = cli("run", "hydra.mode=MULTIRUN", "pipeline=demo", "strategy=none,files", f"source.path={tpch_orders}", f"sink.database={db}")
    assert res.code == 0, res.err
    assert sum(1 for line in res.out.splitlines() if "total" in line and "15,000" in line) == 2, res.out
    mine = tmp_path / "mine" / "pipeline"
    mine.mkdir(parents=True)
    (mine / "sweeping.yaml").write_text("# @package _global_\ndefaults:\n  - demo\nhydra:\n  mode: MULTIRUN\n")
    res = cli("run", "--config-dir", str(tmp_path / "mine"), "pipeline=sweeping", "strategy=none,files",
              f"source.path={tpch_orders}", f"sink.database={db}")
    assert res.code == 0, res.err
    assert sum(1 for line in res.out.splitlines() if "total" in line and "15,000" in line) == 2, res.out

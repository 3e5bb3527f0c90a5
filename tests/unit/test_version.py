"""The package says its version (main had no conveyor/__init__.py and no __version__)."""

from __future__ import annotations

import tomllib

import conveyor
from tests.helpers import REPO


def test_the_package_says_the_version_it_was_installed_as() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert conveyor.__version__ == declared

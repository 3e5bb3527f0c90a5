"""The wheel ships every package of the source tree (setuptools' explicit list in pyproject.toml)."""

import tomllib

from tests.helpers import REPO


def test_every_package_under_conveyor_and_configs_is_listed_for_the_wheel():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    # a folder with modules or configs is a package to ship (conveyor.connectors is a namespace package)
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "conveyor").rglob("*.py")}
    on_disk |= {".".join(("conveyor", *p.parent.relative_to(REPO).parts)) for p in (REPO / "configs").rglob("*.*")
                if "__pycache__" not in p.parts}
    assert on_disk - listed == set(), "packages a wheel install would miss"
    assert listed - on_disk == set(), "listed packages that do not exist"


def test_duckdb_is_pinned_only_where_the_extension_needs_it_and_every_suggested_extra_exists():
    import re

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("duckdb==") for dep in project["dependencies"]), "the core pins duckdb"
    bench = project["optional-dependencies"]["bench"]
    assert "duckdb==1.5.5" in bench and "duckdb-extension-postgres==1.5.5" in bench
    # the core's duckdb goes no higher than the extension wheels' version: adding the postgres extra never downgrades it
    assert "duckdb>=1.1,<=1.5.5" in project["dependencies"]
    suggested = set(re.findall(r'"(\w+)"', (REPO / "conveyor" / "kit" / "fs.py").read_text().split("_EXTRA =")[1].split("}")[0]))
    extras = set(project["optional-dependencies"])
    assert {"s3", "gcs", "azure"} <= suggested and suggested & {"s3", "gcs", "azure"} <= extras

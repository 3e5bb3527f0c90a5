"""The key reference (docs/reference/, built by make test's `mkdocs build --strict`) is made from the plugins'
config classes: every key of every installed plugin is on its page with its default and the `#:` comment above it
in the code, so the reference cannot drift (on the main this started from, there was no reference of the keys)."""

from __future__ import annotations

import dataclasses

from conveyor import registry
from conveyor.keyref import KINDS, pages


def test_every_key_of_every_plugin_is_on_its_page_with_its_comment() -> None:
    made = pages()
    checked = 0
    for kind in KINDS:
        for name in registry.names(kind):
            text = made[f"reference/{kind}-{name}.md"]
            config = registry.load(kind, name).config_class
            for f in dataclasses.fields(config):
                if not f.name.startswith("_"):
                    assert f"| `{kind}.{f.name}` |" in text, f"{kind} {name}: {f.name} is not on its page"
                    checked += 1
            assert f"[{name}]({kind}-{name}.md)" in made["reference/index.md"]
    assert checked > 150
    postgres = made["reference/sink-postgres.md"]
    assert "| `sink.definition` | `bool` | `True` | the same from a PostgreSQL source table: the rest of its definition too" in postgres
    assert "| `sink.password_env` | `str` | `\"PGPASSWORD\"` |" in postgres
    assert "| `source.table` |" in made["reference/source-postgres.md"]

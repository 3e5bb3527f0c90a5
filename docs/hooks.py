"""MkDocs hook: the key reference (docs/reference/) made from the plugins' config classes before every build
(conveyor/keyref.py), so it cannot drift from the code. The pages are not kept in git (.gitignore)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_pre_build(config: Any, **_: Any) -> None:
    from conveyor.keyref import pages

    docs = Path(config["docs_dir"])
    for rel, text in pages().items():
        path = docs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)

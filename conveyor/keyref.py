"""The key reference of every plugin (``docs/reference/``), made from the plugins' config dataclasses: each
key, its type, its default and the ``#:`` comment above it in the source, so the reference cannot drift from
the code (``docs/hooks.py`` writes it when the documentation is built; tests/unit/test_keyref.py checks it)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

KINDS = ("source", "sink", "strategy", "runtime")


def _comments(cls: type) -> dict[str, str]:
    """{field: the ``#:`` lines right above it} over the class and its bases."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        tree = ast.parse(textwrap.dedent("".join(lines)))
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node in body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                above, i = [], node.lineno - 2
                while i >= 0 and lines[i].strip().startswith("#:"):
                    above.insert(0, lines[i].strip()[2:].strip())
                    i -= 1
                if above:
                    out[node.target.id] = " ".join(above)
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    return "(required)" if value == "???" else f"`{value!r}`" if not isinstance(value, str) else f'`"{value}"`'


def page(kind: str, name: str) -> str:
    """The Markdown page of one plugin's keys."""
    from conveyor import registry

    cls = registry.load(kind, name)
    config = cls.config_class
    import sys

    own = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or ""  # its own (or its module's), not a base class's
    doc = " ".join(inspect.cleandoc(own).split("\n\n")[0].split())
    rows = []
    comments = _comments(config) if dataclasses.is_dataclass(config) else {}
    for f in dataclasses.fields(config) if dataclasses.is_dataclass(config) else []:
        if f.name.startswith("_"):
            continue
        typ = (getattr(f.type, "__name__", None) or str(f.type)).replace("|", "\\|")
        meaning = comments.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{kind}.{f.name}` | `{typ}` | {_default(f)} | {meaning} |")
    head = f"# {kind} `{name}`\n\n{doc}\n\n`{kind}={name}` on the command line; every key below can be overridden as `{kind}.<key>=value`.\n\n"
    return head + "| key | type | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def pages() -> dict[str, str]:
    """{relative path: Markdown} of every installed plugin's page, and the index."""
    from conveyor import registry

    out, index = {}, ["# Keys of every plugin", "", "Made from the plugins' config classes when these pages are built.", ""]
    for kind in KINDS:
        index.append(f"## {kind.capitalize()}s\n")
        for name in registry.names(kind):
            try:
                out[f"reference/{kind}-{name}.md"] = page(kind, name)
            except Exception as exc:  # a plugin whose extra is not installed: said, not a broken build
                out[f"reference/{kind}-{name}.md"] = f"# {kind} `{name}`\n\nNot installed here: {exc}\n"
            index.append(f"- [{name}]({kind}-{name}.md)")
        index.append("")
    out["reference/index.md"] = "\n".join(index)
    return out

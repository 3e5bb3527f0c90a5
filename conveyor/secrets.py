"""Which config values are secrets, and the same config with them masked: for every file a run writes
(report.json, manifest.json, the run's .hydra copies) and for the refusal of a secret written into a config."""

from __future__ import annotations

import re
from typing import Any

_SECRET_PARTS = ("password", "passwd", "secret", "token", "credential", "private_key")
#: settings named like a key that hold no secret: columns, and whether to make the target's primary key
_NOT_SECRETS = ("distribute_key", "primary_key")


def is_secret_key(name: str) -> bool:
    """A key whose value may be a secret (not the *name* of a variable or file that holds one)."""
    low = name.lower()
    if low.endswith(("_env", "_file", "_path")) or low in _NOT_SECRETS:
        return False
    return low == "key" or low.endswith("_key") or any(part in low for part in _SECRET_PARTS)


def mask(value: Any) -> Any:
    """Config with secret-looking values as ***, and passwords in URIs hidden; ${oc.env:...} stays."""
    if isinstance(value, dict):
        return {k: ("***" if is_secret_key(str(k)) and v not in (None, "") and not _is_reference(v) else mask(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        return re.sub(r"(://[^:/@\s]+):[^@/\s]+@", r"\1:***@", value)
    return value


def mask_override(text: str) -> str:
    """A command-line override with its secrets masked: a secret key's value (``sink.password=x``, ``{token: x}``)
    and a URI's password; a reference (``${oc.env:X}``) stays as written."""
    def hide(match: re.Match[str]) -> str:
        key, value = match.group(1), match.group(2)
        if not is_secret_key(key.split(".")[-1].lstrip("+~")) or value.strip("'\"").startswith("${"):
            return match.group(0)
        return match.group(0)[: match.start(2) - match.start(0)] + "***"

    text = re.sub(r"([\w.+~]+)\s*[=:]\s*('[^']*'|\"[^\"]*\"|[^,{}\[\]\s]+)", hide, text)
    return re.sub(r"(://[^:/@\s]+):[^@/\s]+@", r"\1:***@", text)


def _is_reference(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")



__all__ = ["is_secret_key", "mask", "mask_override"]

"""Connection settings shared by the database connectors: unset keys from the client's environment
variables, and the password from an environment variable or a file, read where a connection opens."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from conveyor.errors import ConfigError, scrub_value


def fill_from_env(conf: Any, defaults: Mapping[str, tuple[str, str]]) -> None:
    """Set each unset key of ``conf`` from its variable, else its default ({key: (variable, default)});
    ``port`` must be a number."""
    for key, (var, default) in defaults.items():
        if getattr(conf, key) in (None, ""):
            value: Any = os.environ.get(var) or default
            if key == "port":
                if not value.isdigit():
                    raise ValueError(f"port: ${var}={value!r} is not a port number")
                value = int(value)
            setattr(conf, key, value)


def read_password(password_env: str | None, password_file: str | None, client_default: str) -> str | None:
    """The first line of ``password_file``, else ``$password_env``. The client's own variable
    (``client_default``: PGPASSWORD, MYSQL_PWD) may be unset (no password); a variable the user named
    on purpose must be set."""
    if password_file:
        try:
            with open(password_file, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"password_file {password_file!r}: {exc.strerror}", key="password_file") from None
    if not password_env:
        return None
    value = os.environ.get(password_env)
    if value is None and password_env != client_default:
        raise ConfigError(f"password_env: the environment variable {password_env} is not set",
                          key="password_env", hint=f"export {password_env}=..., or use password_file")
    return value


class ScrubsPassword:
    """``scrub(text)``: ``text`` with the connection's password (its ``password()``) masked where it stands as
    a value; a password that cannot be read (its variable unset) leaves the text as it is."""

    def password(self) -> str | None:
        raise NotImplementedError

    def scrub(self, text: str) -> str:
        try:
            pw = self.password()
        except ConfigError:
            return text
        return scrub_value(text, pw)


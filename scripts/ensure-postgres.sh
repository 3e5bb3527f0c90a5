#!/usr/bin/env bash
# Makes sure this machine has what the tests' throwaway PostgreSQL servers need: the server
# binaries (initdb, pg_ctl, postgres) and psql (the pass-through reads the source's COPY stream
# with it, on every worker). Installs Debian's packages when one is missing, then checks again.
# PG_BIN_GLOB: where Debian puts the server binaries (a test points it elsewhere).
set -euo pipefail
PG_BIN_GLOB=${PG_BIN_GLOB:-/usr/lib/postgresql/*/bin}

have_server() { compgen -G "$PG_BIN_GLOB/initdb" >/dev/null || command -v initdb >/dev/null; }
have_psql() { command -v psql >/dev/null || compgen -G "$PG_BIN_GLOB/psql" >/dev/null; }

missing=()
have_server || missing+=(postgresql)
have_psql || missing+=(postgresql-client)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "PostgreSQL ${missing[*]} not found: installing Debian's packages (${missing[*]})" >&2
if ! command -v apt-get >/dev/null; then
  echo "error: no apt-get here: install PostgreSQL's server and client (initdb, pg_ctl, psql) with your system's packages" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
if ! have_server || ! have_psql; then
  echo "error: installed ${missing[*]} but initdb or psql is still missing (looked in $PG_BIN_GLOB and PATH)" >&2
  exit 1
fi
echo "PostgreSQL ready: $(compgen -G "$PG_BIN_GLOB/initdb" | head -1 || command -v initdb), $(command -v psql || compgen -G "$PG_BIN_GLOB/psql" | head -1)" >&2

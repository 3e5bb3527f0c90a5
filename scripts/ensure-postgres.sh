#!/usr/bin/env bash
# Makes sure this machine has what the tests' throwaway PostgreSQL servers need: the server
# binaries (initdb, pg_ctl, postgres), psql (the pass-through reads the source's COPY stream with
# it, on every worker) and pg_partman for each installed server version (the partitioned-target
# tests). Installs Debian's packages when one is missing, then checks again.
# PG_BIN_GLOB / PG_SHARE_DIR: where Debian puts server binaries and extensions (a test points them elsewhere).
set -euo pipefail
PG_BIN_GLOB=${PG_BIN_GLOB:-/usr/lib/postgresql/*/bin}
PG_SHARE_DIR=${PG_SHARE_DIR:-/usr/share/postgresql}

have_server() { compgen -G "$PG_BIN_GLOB/initdb" >/dev/null || command -v initdb >/dev/null; }
have_psql() { command -v psql >/dev/null || compgen -G "$PG_BIN_GLOB/psql" >/dev/null; }
majors() { compgen -G "$PG_BIN_GLOB/initdb" | sed -E 's#.*/([0-9]+)/bin/initdb$#\1#' | sort -u; }
no_partman() { for v in $(majors); do [ -f "$PG_SHARE_DIR/$v/extension/pg_partman.control" ] || echo "postgresql-$v-partman"; done; }

updated=""
install() {
  echo "PostgreSQL: installing Debian's packages: $*" >&2
  if ! command -v apt-get >/dev/null; then
    echo "error: no apt-get here: install $* (PostgreSQL's server, psql, pg_partman) with your system's packages" >&2
    exit 1
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$updated" ]; then $sudo apt-get update -qq; updated=1; fi
  $sudo apt-get install -y -qq "$@" >/dev/null
}

missing=()
have_server || missing+=(postgresql)
have_psql || missing+=(postgresql-client)
if [ ${#missing[@]} -gt 0 ]; then
  install "${missing[@]}"
  if ! have_server || ! have_psql; then
    echo "error: installed ${missing[*]} but initdb or psql is still missing (looked in $PG_BIN_GLOB and PATH)" >&2
    exit 1
  fi
fi
partman=$(no_partman)
if [ -n "$partman" ]; then
  # shellcheck disable=SC2086
  install $partman
  if [ -n "$(no_partman)" ]; then
    echo "error: installed $partman but pg_partman.control is still missing under $PG_SHARE_DIR" >&2
    exit 1
  fi
fi
if [ ${#missing[@]} -gt 0 ] || [ -n "$partman" ]; then
  echo "PostgreSQL ready: $(compgen -G "$PG_BIN_GLOB/initdb" | head -1 || command -v initdb), $(command -v psql || compgen -G "$PG_BIN_GLOB/psql" | head -1), pg_partman" >&2
fi

#!/usr/bin/env bash
# Makes sure PostgreSQL server binaries (initdb, pg_ctl) are on this machine; the tests start
# their own throwaway servers from them. Installs Debian's `postgresql` package when missing.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
echo "PostgreSQL server binaries not found: installing Debian's postgresql package" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq postgresql >/dev/null
ls /usr/lib/postgresql/*/bin/initdb

#!/usr/bin/env bash
# Makes sure this machine has what the tests' throwaway MariaDB (MySQL) servers need: mariadbd and
# mariadb-install-db (Debian's mariadb-server), and the mysql system user the server runs as when
# started by root. Installs Debian's package when one is missing, then checks again. The package's own
# service is not used: each test session starts its servers in temp folders on loopback ports.
set -euo pipefail

have() { command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || [ -x /usr/sbin/mysqld ]; }
have_install_db() { command -v mariadb-install-db >/dev/null || command -v mysql_install_db >/dev/null; }

if ! have || ! have_install_db; then
  echo "MariaDB: installing Debian's package mariadb-server" >&2
  if ! command -v apt-get >/dev/null; then
    echo "error: no apt-get here: install MariaDB's server (mariadbd, mariadb-install-db) with your system's packages" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  # the package would start its own service: policy-rc.d tells it not to (the tests start their own servers)
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq mariadb-server >/dev/null
  if ! have || ! have_install_db; then
    echo "error: installed mariadb-server but mariadbd or mariadb-install-db is still missing" >&2
    exit 1
  fi
fi
if [ "$(id -u)" = 0 ] && ! id mysql >/dev/null 2>&1; then
  echo "error: the mysql system user is missing (Debian's mariadb-server makes it): the test servers run as it" >&2
  exit 1
fi
echo "MariaDB ready: $(command -v mariadbd || echo /usr/sbin/mariadbd)"

#!/usr/bin/env bash
# Makes sure this machine has what the tests' throwaway ClickHouse servers need: clickhouse-server (and
# clickhouse-client, which the benchmark's raw pipe uses), from Debian's packages when missing, and the
# clickhouse system user the server runs as when started by root. The package's own service is not
# used: each test session starts its server in a temp folder on loopback ports (conveyor/testing/chserver.py).
set -euo pipefail

have() { command -v clickhouse-server >/dev/null || [ -x /usr/sbin/clickhouse-server ] || command -v clickhouse >/dev/null; }
have_client() { command -v clickhouse-client >/dev/null || command -v clickhouse >/dev/null; }

if ! have || ! have_client; then
  echo "ClickHouse: installing Debian's packages clickhouse-server clickhouse-client" >&2
  if ! command -v apt-get >/dev/null; then
    echo "error: no apt-get here: install ClickHouse's server and client with your system's packages" >&2
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
  $sudo apt-get install -y -qq clickhouse-server clickhouse-client >/dev/null
  if ! have || ! have_client; then
    echo "error: installed clickhouse-server but its server or client binary is still missing" >&2
    exit 1
  fi
fi
if [ "$(id -u)" = 0 ] && ! id clickhouse >/dev/null 2>&1; then
  echo "error: the clickhouse system user is missing (Debian's clickhouse-server makes it): the test servers run as it" >&2
  exit 1
fi
echo "ClickHouse ready: $(command -v clickhouse-server || echo /usr/sbin/clickhouse-server)"

#!/usr/bin/env bash
# Starts, stops or reports the local PostgreSQL server that weir's PostgreSQL outbox and its tests use.
#   scripts/postgres.sh start|stop|status|url|wipe
# Binaries: Debian's postgresql package (/usr/lib/postgresql/<newest>/bin), else initdb/pg_ctl on the PATH,
# else (as root, with apt-get) the package is installed, as scripts/chromium.sh does for Chromium.
# Data lives in .weir/postgres (WEIR_STATE_DIR, or WEIR_PG_DATA for the data dir itself), the server listens
# on 127.0.0.1:${WEIR_PG_PORT:-15432} only (TCP, no Unix socket), with one superuser and one database, both
# named weir, trusted without a password (loopback only: a development server, not a production one).
# PostgreSQL refuses to run as root: as root, initdb and pg_ctl run as WEIR_PG_USER (default: the package's
# user postgres if it exists, else nobody), which owns the data dir.
# DATABASE_URL set => an existing server is used and this script does nothing (url prints it).
# Exit status: 0 done; 2 PostgreSQL is not installed and installing it needs root (a caller may skip); 1 otherwise.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
state_dir="${WEIR_STATE_DIR:-$root/.weir}"
port="${WEIR_PG_PORT:-15432}"
ready_timeout="${WEIR_PG_READY_TIMEOUT:-60}"
url="postgresql://weir@127.0.0.1:$port/weir"

die() { echo "postgres: $*" >&2; exit 1; }

# The newest Debian cluster's binaries, else the PATH's.
find_bin_dir() {
  local dir
  if [ -n "${WEIR_PG_BIN:-}" ]; then echo "$WEIR_PG_BIN"; return 0; fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
  return 1
}

need_bin_dir() {
  if bin="$(find_bin_dir)"; then return 0; fi
  if [ "$(id -u)" != "0" ]; then
    echo "postgres: PostgreSQL is not installed, and installing it needs root: sudo apt-get install -y postgresql (or set DATABASE_URL to an existing server)" >&2
    exit 2
  fi
  command -v apt-get >/dev/null 2>&1 || die "PostgreSQL is not installed and this machine has no apt-get: install it, or set DATABASE_URL to an existing server"
  echo "postgres: PostgreSQL is not installed; installing Debian's postgresql package with apt-get (root)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
  bin="$(find_bin_dir)" || die "apt-get installed postgresql, but no initdb/pg_ctl was found"
}

# As root, every server command runs as an unprivileged user (PostgreSQL refuses root).
server_user() {
  if [ -n "${WEIR_PG_USER:-}" ]; then echo "$WEIR_PG_USER"; elif id postgres >/dev/null 2>&1; then echo postgres; else echo nobody; fi
}

as_server_user() {
  if [ "$(id -u)" = "0" ]; then runuser -u "$(server_user)" -- "$@"; else "$@"; fi
}

# The data dir: WEIR_PG_DATA, else $state_dir/postgres. As root, the server user must reach it: a state dir
# under a private home (/root is 0700, as in CI) cannot be, so the data goes to /var/tmp instead (said so).
choose_data_dir() {
  data="${WEIR_PG_DATA:-$state_dir/postgres}"
  [ "$(id -u)" = "0" ] || return 0
  mkdir -p "$(dirname "$data")"
  if [ -z "${WEIR_PG_DATA:-}" ] && ! runuser -u "$(server_user)" -- test -x "$(dirname "$data")"; then
    data="/var/tmp/weir-postgres-$(printf '%s' "$root" | md5sum | cut -c1-8)"
    echo "postgres: $(server_user) cannot reach $state_dir (a parent directory is private); data in $data" >&2
  fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

is_running() { [ -f "$data/postmaster.pid" ] && as_server_user "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; }

init_cluster() {
  [ -f "$data/PG_VERSION" ] && return 0
  mkdir -p "$data"
  chmod 700 "$data"
  if [ "$(id -u)" = "0" ]; then chown "$(server_user)": "$data"; fi
  as_server_user "$bin/initdb" -D "$data" -U weir --auth=trust -E UTF8 --no-locale >"$data.initdb.log" 2>&1 \
    || { cat "$data.initdb.log" >&2; die "initdb failed (log: $data.initdb.log)"; }
  cat >>"$data/postgresql.conf" <<CONF
# weir: a local development server on loopback only (scripts/postgres.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = ''
max_connections = 200
CONF
}

start() {
  if [ -n "${DATABASE_URL:-}" ]; then echo "postgres: DATABASE_URL set, using that server"; return 0; fi
  need_bin_dir
  choose_data_dir
  if is_running && port_open; then echo "postgres: already running on 127.0.0.1:$port ($url)"; return 0; fi
  if port_open; then die "port $port is taken by another process: stop it or set WEIR_PG_PORT"; fi
  init_cluster
  # the port is passed on the command line too: a data dir made under another WEIR_PG_PORT follows this one
  as_server_user "$bin/pg_ctl" start -D "$data" -l "$data/server.log" -o "-p $port" -w -t "$ready_timeout" >/dev/null \
    || { tail -40 "$data/server.log" >&2 2>/dev/null || true; die "the server did not start (log: $data/server.log)"; }
  if ! as_server_user "$bin/psql" -h 127.0.0.1 -p "$port" -U weir -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'weir'" | grep -q 1; then
    as_server_user "$bin/createdb" -h 127.0.0.1 -p "$port" -U weir weir || die "creating the database weir failed"
  fi
  echo "postgres: PostgreSQL $("$bin/pg_ctl" --version | awk "{print \$3}") ready on 127.0.0.1:$port ($url, data in $data)"
}

stop() {
  [ -n "${DATABASE_URL:-}" ] && { echo "postgres: DATABASE_URL set, nothing to stop"; return 0; }
  bin="$(find_bin_dir)" || { echo "postgres: not installed"; return 0; }
  choose_data_dir 2>/dev/null
  if ! is_running; then echo "postgres: not running"; return 0; fi
  as_server_user "$bin/pg_ctl" stop -D "$data" -m fast -w >/dev/null
  echo "postgres: stopped"
}

status() {
  if [ -n "${DATABASE_URL:-}" ]; then echo "postgres: DATABASE_URL set"; return 0; fi
  bin="$(find_bin_dir)" || { echo "postgres: not installed"; exit 1; }
  choose_data_dir 2>/dev/null
  if is_running; then echo "postgres: running on 127.0.0.1:$port ($url)"; else echo "postgres: stopped"; exit 1; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  url) echo "${DATABASE_URL:-$url}" ;;
  wipe) stop; choose_data_dir 2>/dev/null; rm -rf "$data" "$data.initdb.log"; echo "postgres: data wiped" ;;
  *) echo "usage: $0 start|stop|status|url|wipe" >&2; exit 2 ;;
esac

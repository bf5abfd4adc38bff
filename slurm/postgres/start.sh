#!/usr/bin/env bash
# Start a throw-away PostgreSQL server on loopback, for the `postgres` tests, CI and trying a
# multi-node search on one machine. Needs root; installs Debian's `postgresql` when missing.
#
#   eval "$(slurm/postgres/start.sh)"   # prints `export ARMORLAB_POSTGRES_URL=postgresql://...`
#   armorlab tune SPEC --storage "$ARMORLAB_POSTGRES_URL" ...
#
# The server runs as the `postgres` user, listens on 127.0.0.1 only, and keeps everything (data,
# socket, log) in one state dir: $ARMORLAB_PG_DIR (default /tmp/armorlab-postgres), port
# $ARMORLAB_PG_PORT (default 16832). Role and database `armorlab` (password `armorlab`; the role
# may create databases, so tests can make one each). Durability is off (fsync, synchronous
# commit): a crash of the machine loses the data, which is the point of a throw-away server.
# Idempotent: when it is already up it only prints the export line. ARMORLAB_PG_FRESH=1 stops it
# and wipes the state dir first (CI).
set -euo pipefail

D="${ARMORLAB_PG_DIR:-/tmp/armorlab-postgres}"
PORT="${ARMORLAB_PG_PORT:-16832}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
URL="postgresql://armorlab:armorlab@127.0.0.1:$PORT/armorlab"

say() { echo "[postgres-local] $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=../apt-install.sh
source "$HERE/../apt-install.sh"

[[ "$(id -u)" == 0 ]] || die "must run as root (it installs packages and runs the server as postgres)"

if [[ "${ARMORLAB_PG_FRESH:-0}" == 1 ]]; then
    "$HERE/stop.sh" >&2 || true
    rm -rf "$D"
fi

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
BIN="$(pg_bin)"
if [[ -z "$BIN" || ! -x "$BIN/initdb" ]] || ! getent passwd postgres >/dev/null; then
    say "installing postgresql"
    mkdir -p "$(dirname "$D")"
    apt_install_quietly "$D.apt.log" postgresql || die "apt-get install failed, see $D.apt.log"
    BIN="$(pg_bin)"
    [[ -x "$BIN/initdb" ]] || die "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
fi

as_pg() { runuser -u postgres -- "$@"; }
psql_admin() { as_pg "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$D/run" -p "$PORT" -U postgres "$@"; }

# ---------------------------------------------------------------- fast path: already up
if [[ -s "$D/data/postmaster.pid" ]] && as_pg "$BIN/pg_ctl" -D "$D/data" status >/dev/null 2>&1 \
        && as_pg "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -d armorlab; then
    echo "export ARMORLAB_POSTGRES_URL=$URL"
    exit 0
fi

"$HERE/stop.sh" >&2 || true   # a half-started leftover would hold the port or the PID file
mkdir -p "$D"/{run,log}
chown -R postgres:postgres "$D"
chmod 0700 "$D"

if [[ ! -s "$D/data/PG_VERSION" ]]; then
    rm -rf "$D/data"
    # trust on the socket (inside the root-only state dir), passwords over TCP
    as_pg "$BIN/initdb" -D "$D/data" -U postgres -E UTF8 --no-locale --no-sync \
        --auth-local=trust --auth-host=scram-sha-256 >"$D/log/initdb.log" 2>&1 \
        || die "initdb failed, see $D/log/initdb.log"
    cat >> "$D/data/postgresql.conf" <<CONF
# armorlab throw-away server (slurm/postgres/start.sh)
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$D/run'
max_connections = 200
shared_buffers = 32MB
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
fi

as_pg "$BIN/pg_ctl" -D "$D/data" -l "$D/log/postgres.log" -w -t 60 start </dev/null >>"$D/log/pg_ctl.log" 2>&1 \
    || die "the server did not start, see $D/log/postgres.log"

psql_admin -d postgres <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'armorlab') THEN
    CREATE ROLE armorlab LOGIN CREATEDB PASSWORD 'armorlab';
  END IF;
END $$;
SQL
if [[ "$(psql_admin -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'armorlab'")" != 1 ]]; then
    psql_admin -d postgres -c "CREATE DATABASE armorlab OWNER armorlab"
fi
say "server up (state dir $D, port $PORT)"
echo "export ARMORLAB_POSTGRES_URL=$URL"

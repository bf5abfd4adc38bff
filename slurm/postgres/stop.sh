#!/usr/bin/env bash
# Stop the PostgreSQL server of slurm/postgres/start.sh (same $ARMORLAB_PG_DIR); the data stays
# unless ARMORLAB_PG_WIPE=1. Fast shutdown (open sessions are ended), immediate after 30 s.
set -uo pipefail
D="${ARMORLAB_PG_DIR:-/tmp/armorlab-postgres}"
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"

if [[ -n "$BIN" && -s "$D/data/postmaster.pid" ]]; then
    if runuser -u postgres -- "$BIN/pg_ctl" -D "$D/data" status >/dev/null 2>&1; then
        runuser -u postgres -- "$BIN/pg_ctl" -D "$D/data" -m fast -w -t 30 stop >/dev/null 2>&1 \
            || runuser -u postgres -- "$BIN/pg_ctl" -D "$D/data" -m immediate -w -t 30 stop >/dev/null 2>&1
        echo "[postgres-local] stopped the server in $D" >&2
    fi
fi
if [[ "${ARMORLAB_PG_WIPE:-0}" == 1 ]]; then rm -rf "$D"; fi
exit 0

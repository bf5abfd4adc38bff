#!/usr/bin/env bash
# Start a real one-node Slurm cluster (munge, MariaDB + slurmdbd, slurmctld, slurmd) on this
# machine, for tests and CI. Needs root; installs the Debian packages itself when missing.
#
#   eval "$(slurm/local/start.sh)"      # prints `export SLURM_CONF=...` on stdout
#
# Everything (config, state, spool, logs, PID files, the munge socket, the database) lives under
# one state dir: $ARMORLAB_SLURM_DIR (default /tmp/armorlab-slurm). Idempotent: when the cluster
# is already up it only prints the export line. ARMORLAB_SLURM_FRESH=1 stops it and wipes the
# state dir first (CI). ARMORLAB_SLURM_CPUS sets the CPUs the node advertises (default 8).
set -euo pipefail

D="${ARMORLAB_SLURM_DIR:-/tmp/armorlab-slurm}"
CPUS="${ARMORLAB_SLURM_CPUS:-8}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF="$D/etc/slurm.conf"
SOCK="$D/munge/munge.socket.2"
DB_PORT="${ARMORLAB_SLURM_DB_PORT:-16820}"
export SLURM_CONF="$CONF"

say() { echo "[slurm-local] $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=../apt-install.sh
source "$HERE/../apt-install.sh"

# A daemon counts as alive only when its PID file names a process that is not a zombie:
# PID 1 here reaps late, so `kill -0` alone would call a just-killed daemon alive.
alive() {
    local pidfile="$D/run/$1.pid" pid state
    [[ -s "$pidfile" ]] || return 1
    pid="$(tr -dc '0-9' < "$pidfile")"
    [[ -n "$pid" && -r "/proc/$pid/stat" ]] || return 1
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)"
    [[ "$state" != "Z" && "$state" != "X" ]]
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit="$1" what="$2"; shift 2
    local t0=$SECONDS
    until "$@" >/dev/null 2>&1; do
        (( SECONDS - t0 < limit )) || die "$what not ready after ${limit}s (logs: $D/log)"
        sleep 0.2
    done
}

node_idle() { [[ "$(sinfo -h -n localhost -o %T 2>/dev/null)" == idle* ]]; }

if [[ "$(id -u)" != 0 ]]; then
    die "must run as root (it installs packages and runs the daemons as root)"
fi

if [[ "${ARMORLAB_SLURM_FRESH:-0}" == 1 ]]; then
    "$HERE/stop.sh" >&2 || true
    rm -rf "$D"
fi

# ---------------------------------------------------------------- fast path: already up
if alive munged && alive mariadbd && alive slurmdbd && alive slurmctld && alive slurmd && node_idle; then
    echo "export SLURM_CONF=$CONF"
    exit 0
fi

# ---------------------------------------------------------------- packages
mkdir -p "$(dirname "$D")"
need=()
for pair in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client \
            slurmdbd:slurmdbd mariadbd:mariadb-server; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || [[ -x "/usr/sbin/${pair%%:*}" ]] || need+=("${pair#*:}")
done
if (( ${#need[@]} )); then
    say "installing ${need[*]}"
    apt_install_quietly "$D.apt.log" munge slurmctld slurmd slurm-client slurmdbd mariadb-server \
        || die "apt-get install failed, see $D.apt.log"
fi
PATH="/usr/sbin:/sbin:$PATH"

# Half-started leftovers would hold ports or PID files: stop them before starting afresh.
"$HERE/stop.sh" >&2 || true

mkdir -p "$D"/{etc,run/daemon,log,spool/ctld,spool/d,munge,mysql}
chmod 0755 "$D/munge"

# ---------------------------------------------------------------- config files
sed -e "s#@D@#$D#g" -e "s#@SOCK@#$SOCK#g" -e "s#@CPUS@#$CPUS#g" \
    "$HERE/slurm.conf.in" > "$CONF"
sed -e "s#@D@#$D#g" -e "s#@SOCK@#$SOCK#g" -e "s#@DB_PORT@#$DB_PORT#g" \
    "$HERE/slurmdbd.conf.in" > "$D/etc/slurmdbd.conf"
chmod 0600 "$D/etc/slurmdbd.conf"   # slurmdbd refuses a readable one (it holds the DB password)

start() {  # start NAME ARGS...: detached, output redirected, so a piped CI step never hangs
    local name="$1"
    setsid "$@" </dev/null >>"$D/log/$name.out" 2>&1 &
    # Not a process-group leader, so setsid execs without forking: $! is the daemon itself.
    echo $! > "$D/run/$name.pid"
}

# ---------------------------------------------------------------- munge
if [[ ! -s "$D/munge/munge.key" ]]; then
    dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 0600 "$D/munge/munge.key"
start munged --force --foreground --key-file="$D/munge/munge.key" --socket="$SOCK" \
    --pid-file="$D/run/daemon/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/munge.seed"
wait_for 20 munged munge --socket="$SOCK" -n

# ---------------------------------------------------------------- MariaDB for slurmdbd
if [[ ! -d "$D/mysql/mysql" ]]; then
    mariadb-install-db --user=root --datadir="$D/mysql" --auth-root-authentication-method=socket \
        --skip-test-db >"$D/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed"
fi
start mariadbd --no-defaults --user=root --datadir="$D/mysql" --socket="$D/run/mysqld.sock" \
    --pid-file="$D/run/daemon/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
    --log-error="$D/log/mariadbd.log" --innodb-buffer-pool-size=32M --skip-name-resolve
wait_for 30 mariadbd mariadb --no-defaults --socket="$D/run/mysqld.sock" -uroot -e "select 1"
mariadb --no-defaults --socket="$D/run/mysqld.sock" -uroot <<'SQL'
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'armorlab';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------- slurmdbd, slurmctld, slurmd
start slurmdbd -D
wait_for 30 slurmdbd bash -c "exec 3<>/dev/tcp/127.0.0.1/16819"
start slurmctld -D -i
wait_for 30 slurmctld scontrol ping
start slurmd -D
wait_for 60 "node localhost" node_idle
say "cluster up (state dir $D)"
echo "export SLURM_CONF=$CONF"

#!/usr/bin/env bash
# Stop the one-node cluster started by slurm/local/start.sh: exactly the daemons whose PIDs it
# recorded, newest first; waits until each is gone (a zombie counts as gone: PID 1 reaps late).
set -uo pipefail
D="${ARMORLAB_SLURM_DIR:-/tmp/armorlab-slurm}"

running() {  # running PID: true while the process exists and is not a zombie
    local state
    [[ -r "/proc/$1/stat" ]] || return 1
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo Z)"
    [[ "$state" != "Z" && "$state" != "X" ]]
}

for name in slurmd slurmctld slurmdbd mariadbd munged; do
    pidfile="$D/run/$name.pid"
    [[ -s "$pidfile" ]] || continue
    pid="$(tr -dc '0-9' < "$pidfile")"
    # the recorded PID must still be that daemon, not a recycled PID of something else
    if [[ -n "$pid" ]] && running "$pid" && grep -qa "$name" "/proc/$pid/cmdline" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 100); do running "$pid" || break; sleep 0.1; done
        if running "$pid"; then kill -KILL "$pid" 2>/dev/null; sleep 0.2; fi
        echo "[slurm-local] stopped $name ($pid)" >&2
    fi
    rm -f "$pidfile"
done
exit 0

# Sourced by slurm/local/start.sh and slurm/postgres/start.sh (not run on its own).
#
#   apt_install_quietly LOG PACKAGE...
#
# Installs Debian packages non-interactively, output to LOG. A policy-rc.d that refuses every
# service start (unless one exists already) keeps the packages' init scripts from starting
# system-wide daemons: the scripts start their own, under their own state dirs. The package
# lists of a fresh machine may be stale or empty: a failed install updates them and tries again.
# Returns non-zero when the packages could not be installed.
apt_install_quietly() {
    local log="$1" own_policy=0 status=0
    shift
    export DEBIAN_FRONTEND=noninteractive
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        own_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >"$log" 2>&1 \
        || { apt-get update -qq >>"$log" 2>&1 \
             && apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1; } \
        || status=$?
    if (( own_policy )); then rm -f /usr/sbin/policy-rc.d; fi
    return "$status"
}

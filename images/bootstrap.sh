#!/bin/sh
# Turns a machine that has python3 into a gpulayer worker, and takes it down again.
#
#   bootstrap.sh install --install-dir DIR --wheelhouse DIR [--python PYTHON]
#                [--token-file FILE] [--join-timeout SECONDS] [--system-site-packages]
#                [--index-version VERSION] [--hand-off [--launched-elsewhere]]
#                [--worker-venv DIR] -- WORKER-START-ARGS...
#   bootstrap.sh stop    --install-dir DIR [--grace SECONDS]
#   bootstrap.sh remove  --install-dir DIR
#
# install: checks python (>= 3.10, with venv), makes DIR/venv, installs the wheels of the
#   wheelhouse into it without any package index (pip runs in place from the wheelhouse's
#   own pip wheel), then starts `python -m gpulayer worker start WORKER-START-ARGS` in a session of its
#   own (pid in DIR/worker.pid, output in DIR/worker.log) and waits until it has joined its
#   control plane, within --join-timeout seconds of the script's start (the install counts).
#   The join token is read from --token-file into GPULAYER_TOKEN, so it never
#   shows in a process listing; the file is deleted once the worker runs. Only when the
#   wheelhouse is missing and a package index answers is gpulayer installed from the index.
#   --worker-venv: the worker's install, made once for this machine and version and verified
#   by the bootstrap (see gpulayer/cloud/bootstrap/host_worker.py): DIR/venv becomes a link to
#   it and nothing is installed.
#   --hand-off: the machine's own launcher starts the worker (a Slurm allocation's step on
#   each node, so the worker runs inside the allocation and ends with it): the script writes
#   DIR/launch, a script the launcher renames and runs, which records the worker's pid and
#   becomes the worker; the install waits for that pid, then for the join as above.
#   --launched-elsewhere: that launcher runs on other machines that share DIR (a Slurm
#   cluster's compute nodes, this script on its login node): the pid is not this machine's,
#   so only the join in DIR/worker.log is waited for.
# stop: ends the worker's process group (TERM, then KILL after --grace seconds), and any
#   process the worker started.
# remove: deletes DIR.
#
# Everything is created under DIR (the worker's home, its jobs, temporary files, pip's
# files); nothing else on the machine is written. Each phase prints one line starting with
# "gpulayer-bootstrap:"; failures print "gpulayer-bootstrap: error: ..." and exit non-zero.

set -eu
umask 077

PREFIX="gpulayer-bootstrap:"

say() {
    printf '%s %s\n' "$PREFIX" "$*"
}

fail() {
    printf '%s error: %s\n' "$PREFIX" "$*" >&2
    exit 1
}

usage() {
    fail "usage: bootstrap.sh install|stop|remove --install-dir DIR ... ($*)"
}

# The install dir must be a dedicated directory: never /, a system directory or a home.
check_install_dir() {
    dir=$1
    case $dir in
        /*) ;;
        *) fail "--install-dir must be an absolute path, not '$dir'" ;;
    esac
    case $dir in
        */../* | */.. | */./* | */. | *//*) fail "--install-dir must be a normalized path, not '$dir'" ;;
    esac
    case $dir in
        */) fail "--install-dir must not end with '/': '$dir'" ;;
    esac
    slashes=$(printf '%s' "$dir" | tr -cd / | wc -c)
    if [ "$slashes" -lt 2 ]; then
        fail "--install-dir must be at least two levels deep (e.g. /var/tmp/gpulayer/JOB), not '$dir'"
    fi
    case $dir in
        /bin/* | /boot/* | /dev/* | /etc/* | /lib/* | /lib32/* | /lib64/* | /libx32/* | /proc/* | \
            /sbin/* | /sys/* | /usr/* | /var/lib | /var/lib/* | /var/log | /var/log/* | /var/tmp | \
            /var/cache | /var/spool | /var/mail | /var/run | /var/run/* | /run/* | /snap/*)
            fail "--install-dir '$dir' lies in a system directory"
            ;;
    esac
    case $dir in
        /home/* | /Users/*)
            if [ "$slashes" -lt 3 ]; then fail "--install-dir '$dir' is a home directory"; fi
            ;;
    esac
    if [ -n "${HOME:-}" ]; then
        case $HOME/ in
            "$dir"/*) fail "--install-dir '$dir' is or contains the home directory $HOME" ;;
        esac
    fi
}

# The state of a process from /proc (R, S, Z...), empty when there is no such process.
proc_state() {
    if [ -r "/proc/$1/stat" ]; then
        sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1
    elif kill -0 "$1" 2>/dev/null; then
        echo R
    fi
}

alive() {
    state=$(proc_state "$1")
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Is pid $1 the worker of this install dir? A stale pid file may name a reused pid.
is_our_worker() {
    if [ -r "/proc/$1/cmdline" ]; then
        tr '\000' ' ' <"/proc/$1/cmdline" | grep -F -q -- "$install_dir/venv/bin/python"
    else
        alive "$1"
    fi
}

# Processes of the worker's group plus every descendant of the worker (jobs run in sessions of
# their own), one pid a line.
worker_tree() {
    ps -e -o pid= -o ppid= -o pgid= 2>/dev/null | awk -v root="$1" '
        { parent[$1] = $2; group[$1] = $3 }
        END {
            found[root] = 1
            for (pid in group) if (group[pid] == root) found[pid] = 1
            changed = 1
            while (changed) {
                changed = 0
                for (pid in parent) if (!(pid in found) && (parent[pid] in found)) {
                    found[pid] = 1; changed = 1
                }
            }
            for (pid in found) print pid
        }'
}

# Processes that belong to the install dir whoever started them: those naming a path in it
# (the worker, pip) and those working in it (jobs). Not this shell nor its parent.
install_dir_processes() {
    {
        ps -e -o pid= -o args= 2>/dev/null | D="$install_dir/" awk 'index($0, ENVIRON["D"]) { print $1 }'
        find /proc/[0-9]*/cwd -maxdepth 0 \( -lname "$install_dir" -o -lname "$install_dir/*" \) 2>/dev/null |
            sed 's,^/proc/\([0-9]*\)/cwd$,\1,'
    } | sort -u | while read -r p; do
        if [ "$p" != "$$" ] && [ "$p" != "$PPID" ] && alive "$p"; then echo "$p"; fi
    done
}

# Freeze, then kill: nothing forks away while the rest is killed.
kill_all() {
    [ -n "$1" ] || return 0
    say "killing what is left:$1"
    # shellcheck disable=SC2086
    kill -STOP $1 2>/dev/null || true
    # shellcheck disable=SC2086
    kill -KILL $1 2>/dev/null || true
}

stop_worker() {
    grace=$1
    pidfile="$install_dir/worker.pid"
    pid=""
    if [ -f "$pidfile" ]; then
        pid=$(cat "$pidfile")
        case $pid in
            '' | *[!0-9]*) pid="" ;;
        esac
    fi
    tree=""
    if [ -n "$pid" ] && alive "$pid" && is_our_worker "$pid"; then
        tree=$(worker_tree "$pid")
        say "stopping worker $pid"
        kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        ticks=0
        limit=$(awk -v s="$grace" 'BEGIN { printf "%d", s * 10 }')
        while alive "$pid" && [ "$ticks" -lt "$limit" ]; do
            sleep 0.1
            ticks=$((ticks + 1))
        done
        tree="$tree $(worker_tree "$pid")"
    fi
    left=""
    for p in $tree $(install_dir_processes); do
        if [ "$p" != "$$" ] && alive "$p"; then left="$left $p"; fi
    done
    kill_all "$left"
    rm -f "$pidfile"
    say "worker stopped"
}

# --- arguments ---------------------------------------------------------------------------------

[ $# -ge 1 ] || usage "no command"
# --join-timeout counts from here: the install before the worker starts spends the same budget.
started=$(date +%s)
command=$1
shift
install_dir=""
wheelhouse=""
python=python3
token_file=""
join_timeout=60
grace=10
system_site=""
index_version=""
hand_off=""
elsewhere=""
worker_venv=""
while [ $# -gt 0 ]; do
    case $1 in
        --install-dir) [ $# -ge 2 ] || usage "$1 needs a value"; install_dir=$2; shift 2 ;;
        --wheelhouse) [ $# -ge 2 ] || usage "$1 needs a value"; wheelhouse=$2; shift 2 ;;
        --python) [ $# -ge 2 ] || usage "$1 needs a value"; python=$2; shift 2 ;;
        --token-file) [ $# -ge 2 ] || usage "$1 needs a value"; token_file=$2; shift 2 ;;
        --join-timeout) [ $# -ge 2 ] || usage "$1 needs a value"; join_timeout=$2; shift 2 ;;
        --grace) [ $# -ge 2 ] || usage "$1 needs a value"; grace=$2; shift 2 ;;
        --index-version) [ $# -ge 2 ] || usage "$1 needs a value"; index_version=$2; shift 2 ;;
        --system-site-packages) system_site=--system-site-packages; shift ;;
        --hand-off) hand_off=yes; shift ;;
        --launched-elsewhere) elsewhere=yes; shift ;;
        --worker-venv) [ $# -ge 2 ] || usage "$1 needs a value"; worker_venv=$2; shift 2 ;;
        --) shift; break ;;
        *) usage "unknown option $1" ;;
    esac
done
[ -n "$install_dir" ] || usage "--install-dir is required"
check_install_dir "$install_dir"
for number in "$join_timeout" "$grace"; do
    case $number in
        '' | *[!0-9.]* | *.*.*) usage "--join-timeout and --grace take seconds, not '$number'" ;;
    esac
done

case $command in
    stop)
        stop_worker "$grace"
        exit 0
        ;;
    remove)
        if [ -e "$install_dir" ] || [ -L "$install_dir" ]; then
            rm -rf -- "$install_dir"
            say "removed $install_dir"
        else
            say "$install_dir is already gone"
        fi
        exit 0
        ;;
    install) ;;
    *) usage "unknown command $command" ;;
esac

[ -n "$wheelhouse" ] || usage "--wheelhouse is required"

# --- python -------------------------------------------------------------------------------------

say "checking python ($python)"
if ! command -v "$python" >/dev/null 2>&1; then
    fail "python '$python' not found on this machine; install python3 (>= 3.10) or pass --python"
fi
# One interpreter start for all three facts: version, new enough, has venv.
facts=$("$python" -c 'import sys
try:
    import venv
    has_venv = "venv"
except ImportError:
    has_venv = "no-venv"
new = "new" if sys.version_info >= (3, 10) else "old"
print("%d.%d.%d" % sys.version_info[:3], new, has_venv)' 2>/dev/null) || fail "'$python' does not run"
version=${facts%% *}
case $facts in
    *" old "*) fail "python $version at '$python' is too old; gpulayer needs python >= 3.10" ;;
    *" no-venv") fail "python $version has no venv module; install it (Debian/Ubuntu: apt-get install python3-venv)" ;;
esac
say "python $version at $(command -v "$python")"

mkdir -p "$install_dir"
chmod 700 "$install_dir"
venv="$install_dir/venv"
mkdir -p "$install_dir/home" "$install_dir/jobs" "$install_dir/tmp"
# pip and the worker keep their files here rather than in the login user's home or /tmp.
export TMPDIR="$install_dir/tmp"
export XDG_CACHE_HOME="$install_dir/tmp/cache"
export PIP_CONFIG_FILE=/dev/null
export PIP_NO_CACHE_DIR=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONNOUSERSITE=1

# --- install ------------------------------------------------------------------------------------

wheels=""
pip_runner=""
wheel_count=0
if [ -d "$wheelhouse" ]; then
    for wheel in "$wheelhouse"/*.whl; do
        [ -f "$wheel" ] || continue
        case ${wheel##*/} in
            pip-*) pip_runner=$wheel ;;
            *) wheels="$wheels
$wheel"; wheel_count=$((wheel_count + 1)) ;;
        esac
    done
fi

if [ -n "$worker_venv" ]; then
    [ -x "$worker_venv/bin/python" ] || fail "no worker install at $worker_venv"
    rm -rf -- "$venv"
    ln -s "$worker_venv" "$venv" || fail "cannot link $venv to $worker_venv"
    say "worker installed once for this machine: $worker_venv"
elif [ "$wheel_count" -gt 0 ]; then
    [ -n "$pip_runner" ] || fail "the wheelhouse $wheelhouse has no pip to install with"
    say "creating venv $venv"
    rm -rf -- "$venv"
    # shellcheck disable=SC2086
    "$python" -m venv --without-pip $system_site "$venv" || fail "cannot create a venv at $venv"
    say "installing $wheel_count wheels from $wheelhouse (no package index)"
    # The wheel list holds one path a line; paths come from our own wheelhouse names.
    old_ifs=$IFS
    IFS='
'
    # shellcheck disable=SC2086
    "$venv/bin/python" "$pip_runner/pip" install --quiet --no-index --find-links "$wheelhouse" \
        --no-deps --no-compile --no-warn-script-location $wheels ||
        fail "installing from the wheelhouse failed"
    IFS=$old_ifs
else
    say "no wheelhouse at $wheelhouse"
    index=${PIP_INDEX_URL:-https://pypi.org/simple}
    if ! "$python" - "$index" <<'EOF' >/dev/null 2>&1; then
import sys
import urllib.request

urllib.request.urlopen(sys.argv[1].rstrip("/") + "/gpulayer/", timeout=5).close()
EOF
        fail "no wheelhouse at $wheelhouse and the package index $index cannot be reached"
    fi
    if ! "$python" -c 'import ensurepip' 2>/dev/null; then
        fail "python $version has no ensurepip to install from the index (apt-get install python3-venv)"
    fi
    say "creating venv $venv"
    rm -rf -- "$venv"
    # shellcheck disable=SC2086
    "$python" -m venv $system_site "$venv" || fail "cannot create a venv at $venv"
    requirement=gpulayer
    [ -z "$index_version" ] || requirement="gpulayer==$index_version"
    say "installing $requirement from $index"
    "$venv/bin/python" -m pip install --quiet --no-warn-script-location "$requirement" ||
        fail "installing $requirement from $index failed"
fi
# A linked install was checked by the bootstrap before it was handed over.
[ -n "$worker_venv" ] || "$venv/bin/python" -c 'import gpulayer' || fail "gpulayer does not import in $venv"

# --- worker -------------------------------------------------------------------------------------

if [ -f "$install_dir/worker.pid" ]; then
    stop_worker "$grace"
fi
if [ -n "$token_file" ]; then
    [ -r "$token_file" ] || fail "token file $token_file is missing"
fi
unset GPULAYER_SERVER
export GPULAYER_HOME="$install_dir/home"
export GPULAYER_INSTALL_DIR="$install_dir"
log="$install_dir/worker.log"
: >"$log"
rm -f "$install_dir/worker.pid" "$install_dir/launch" "$install_dir/launch.run"
cd "$install_dir"
if [ -n "$elsewhere" ]; then
    # The worker's nodes reach the control plane's tunnel at this host's address: an sshd
    # that keeps forwarded ports on its loopback (GatewayPorts no) would leave the worker
    # waiting out the join timeout, so this host checks it answers there first.
    server="" previous=""
    for arg in "$@"; do
        [ "$previous" != --server ] || server=$arg
        previous=$arg
    done
    address=${server#http://}
    "$python" -c 'import socket, sys
host, _, port = sys.argv[1].rpartition(":")
socket.create_connection((host, int(port)), timeout=5).close()' "$address" 2>/dev/null ||
        fail "the control plane's tunnel does not answer at $address, where the worker's nodes reach it: this host's sshd must allow GatewayPorts clientspecified"
fi
if [ -n "$hand_off" ]; then
    say "handing the worker's start to the machine's launcher"
    # The worker's arguments, NUL-separated: no quoting to get wrong in a script of its own.
    : >"$install_dir/worker.args"
    for arg in "$@"; do printf '%s\0' "$arg" >>"$install_dir/worker.args"; done
    # Paths in the install dir are checked to hold no quote or space (check_install_dir).
    cat >"$install_dir/launch.tmp" <<EOF
# Run by the machine's launcher (renamed to launch.run): becomes this install's worker.
cd '$install_dir' || exit 1
export GPULAYER_HOME='$install_dir/home' GPULAYER_INSTALL_DIR='$install_dir'
export TMPDIR='$install_dir/tmp' XDG_CACHE_HOME='$install_dir/tmp/cache'
export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONNOUSERSITE=1
unset GPULAYER_SERVER
if [ -n '$token_file' ]; then
    GPULAYER_TOKEN=\$(cat '$token_file') || exit 1
    export GPULAYER_TOKEN
    rm -f '$token_file'
fi
echo \$\$ >'$install_dir/worker.pid'
exec '$venv/bin/python' -c 'import os, sys
try:
    os.setsid()
except OSError:
    pass  # already leading a group of its own
args = open(sys.argv[1], "rb").read().split(b"\\0")[:-1]
os.execv(sys.executable, [sys.executable, "-m", "gpulayer", "worker", "start", *map(os.fsdecode, args)])' '$install_dir/worker.args' </dev/null >>'$log' 2>&1
EOF
    mv "$install_dir/launch.tmp" "$install_dir/launch"
    limit=$(awk -v s="$join_timeout" 'BEGIN { printf "%d", (s == int(s)) ? s : int(s) + 1 }')
    pid=""
    while [ -z "$pid" ]; do
        if [ -s "$install_dir/worker.pid" ]; then
            pid=$(cat "$install_dir/worker.pid")
            case $pid in '' | *[!0-9]*) pid="" ;; esac
        fi
        if [ -z "$pid" ] && [ $(($(date +%s) - started)) -ge "$limit" ]; then
            rm -f "$install_dir/launch"
            fail "no launcher on this machine started the worker within ${join_timeout}s"
        fi
        [ -n "$pid" ] || sleep 0.1
    done
else
    if [ -n "$token_file" ]; then
        GPULAYER_TOKEN=$(cat "$token_file")
        export GPULAYER_TOKEN
    fi
    say "starting worker"
    if command -v setsid >/dev/null 2>&1; then
        setsid nohup "$venv/bin/python" -m gpulayer worker start "$@" </dev/null >>"$log" 2>&1 &
    else
        nohup "$venv/bin/python" -c 'import os, sys; os.setsid(); os.execv(sys.executable, [sys.executable] + sys.argv[1:])' \
            -m gpulayer worker start "$@" </dev/null >>"$log" 2>&1 &
    fi
    pid=$!
    echo "$pid" >"$install_dir/worker.pid"
    unset GPULAYER_TOKEN
    if [ -n "$token_file" ]; then rm -f "$token_file"; fi
fi
say "worker-pid=$pid"

limit=$(awk -v s="$join_timeout" 'BEGIN { printf "%d", (s == int(s)) ? s : int(s) + 1 }')
while :; do
    joined=$(sed -n 's/^worker .* (\([^ ()]*\)) joined .*$/\1/p' "$log" | tail -n 1)
    if [ -n "$joined" ]; then
        say "worker-id=$joined"
        say "worker joined its control plane"
        exit 0
    fi
    if [ -z "$elsewhere" ] && ! alive "$pid"; then
        tail -n 20 "$log" | sed "s/^/$PREFIX worker.log: /" >&2
        rm -f "$install_dir/worker.pid"
        if [ -n "$hand_off" ]; then
            fail "the worker exited before joining"  # the launcher's child: no status here
        fi
        wait "$pid" 2>/dev/null && code=0 || code=$?
        fail "the worker exited (status $code) before joining"
    fi
    if [ $(($(date +%s) - started)) -ge "$limit" ]; then
        tail -n 20 "$log" | sed "s/^/$PREFIX worker.log: /" >&2
        # Another machine's worker is ended with that machine's launcher.
        [ -n "$elsewhere" ] || stop_worker 2 >/dev/null
        wait "$pid" 2>/dev/null || true
        fail "the worker did not join its control plane within ${join_timeout}s"
    fi
    sleep 0.1
done

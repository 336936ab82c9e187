#!/usr/bin/env bash
# Start a throwaway redis-server for the test suite, or stop it.
#
#   eval "$(bash .ci/start-redis.sh)"     # installs it if missing, prints the export
#   bash .ci/start-redis.sh stop
#
# Loopback only, a free port, no persistence. Only the export goes to stdout
# (it is eval'd); everything else goes to stderr.
set -euo pipefail

dir="${FANOUT_REDIS_DIR:-${TMPDIR:-/tmp}/fanout-ci-redis}"
pidfile="$dir/redis.pid"

stop() {
    if [[ -f "$pidfile" ]]; then
        kill "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    fi
}

if [[ "${1:-start}" == "stop" ]]; then
    stop
    exit 0
fi
stop # a server left by an earlier run

if ! command -v redis-server >/dev/null; then
    sudo=""
    if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
    {
        $sudo apt-get update
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y redis-server
    } >&2
fi

mkdir -p "$dir"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$pidfile" --dir "$dir" --logfile "$dir/redis.log" >&2

for _ in $(seq 100); do
    if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
        echo "export FANOUT_TEST_REDIS_URL=redis://127.0.0.1:$port/0"
        exit 0
    fi
    sleep 0.1
done
echo "redis-server did not answer on port $port; see $dir/redis.log" >&2
exit 1

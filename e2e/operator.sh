#!/usr/bin/env bash
# Runs the coderun operator on the host against the local cluster, with a pid file and a log under .cluster/.
#   operator.sh start | stop | kill (SIGKILL, for crash tests) | restart | status
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PID_FILE=$repo/.cluster/pids/operator.pid
LOG=$repo/.cluster/logs/operator.log
export KUBECONFIG=${KUBECONFIG:-$repo/.cluster/kubeconfig}

running() { [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; }

start() {
  running && return 0
  mkdir -p "$(dirname "$PID_FILE")" "$(dirname "$LOG")"
  # The validating webhook on the host, where the local API server reaches it.
  CODERUN_WEBHOOK_PORT=${CODERUN_WEBHOOK_PORT:-9443} setsid "$repo/.venv/bin/coderun-operator" --verbose >>"$LOG" 2>&1 </dev/null &
  echo $! > "$PID_FILE"
  # Ready when the liveness endpoint answers: kopf has started its watches and handlers.
  for _ in $(seq 150); do
    curl -fsS http://127.0.0.1:8080/healthz >/dev/null 2>&1 && { echo "operator running (pid $(cat "$PID_FILE"), log $LOG)"; return 0; }
    running || { tail -20 "$LOG" >&2; echo "operator exited; see $LOG" >&2; exit 1; }
    sleep 0.2
  done
  echo "operator not live after 30 s; see $LOG" >&2; exit 1
}

stop() {
  running || { rm -f "$PID_FILE"; return 0; }
  local pid; pid=$(cat "$PID_FILE")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PID_FILE"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  kill) running && kill -KILL "$(cat "$PID_FILE")"; rm -f "$PID_FILE" ;;
  restart) stop; start ;;
  status) running && echo "operator running (pid $(cat "$PID_FILE"), log $LOG)" || echo "operator stopped" ;;
  *) echo "usage: $0 start|stop|kill|restart|status" >&2; exit 2 ;;
esac

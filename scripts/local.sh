#!/usr/bin/env bash
# Run kms-operator locally on an embedded default: a local control plane
# (tests/testenv), the dev KMS (kms-operator dev-server) seeded with
# docs/examples/dev-seed.yaml, operator replicas, and the examples of
# docs/examples, then show the Secret they sync.
#
#   scripts/local.sh          start (or resume) everything and show the synced Secret
#   scripts/local.sh env      the shell lines that point kubectl (and kubectl kms) at
#                             it: eval "$(scripts/local.sh env)"
#   scripts/local.sh status   what runs, and the resources' status
#   scripts/local.sh logs     follow the operator and dev-server logs
#   scripts/local.sh down     stop everything started here
#
# Everything keeps running in the background after the script returns. State
# lives in .local/ at the repository root (KMS_LOCAL_STATE elsewhere).
# REPLICAS (default 3) sets the number of operator replicas; KMS_LOCAL_KMS_ADDR
# (default 127.0.0.1:8080), KMS_LOCAL_HEALTH_PORT (18081) and
# KMS_LOCAL_METRICS_PORT (18443, one port more per replica) where they listen;
# KMS_LOCAL_BIN a kms-operator binary to use instead of building one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
STATE=${KMS_LOCAL_STATE:-$ROOT/.local}
TESTENV=$ROOT/tests/testenv/testenv
REPLICAS=${REPLICAS:-3}
KMS_ADDR=${KMS_LOCAL_KMS_ADDR:-127.0.0.1:8080}
HEALTH_PORT=${KMS_LOCAL_HEALTH_PORT:-18081}
METRICS_PORT=${KMS_LOCAL_METRICS_PORT:-18443}
OPERATOR_NS=kms-operator-system

stop_pidfile() {
  local f=$1
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

case ${1:-up} in
  down)
    for f in "$STATE"/operator-*.pid "$STATE"/devserver.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
    [ -d "$STATE/cluster" ] && "$TESTENV" down "$STATE/cluster"
    echo "stopped (state kept in $STATE; remove it for a clean start)"
    exit 0 ;;
  logs)
    exec tail -F "$STATE"/operator-*.log "$STATE/devserver.log" ;;
  env)
    echo "export KUBECONFIG=$STATE/cluster/kubeconfig"
    echo "export PATH=$STATE/bin:\$PATH"
    exit 0 ;;
  status|up) ;;
  *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac

mkdir -p "$STATE"
export KUBECONFIG=$STATE/cluster/kubeconfig
if [ "${1:-up}" = status ]; then
  "$TESTENV" status "$STATE/cluster"
  for f in "$STATE"/devserver.pid "$STATE"/operator-*.pid; do
    [ -e "$f" ] || continue
    if running "$f"; then echo "$(basename "$f" .pid) running (pid $(cat "$f"))"; else echo "$(basename "$f" .pid) stopped"; fi
  done
  "$("$TESTENV" path kubectl)" get kmssecrets,kmspushsecrets,kmsdynamicsecrets -A 2>/dev/null || true
  exit 0
fi

echo "==> control plane (first run builds kube-apiserver from source: ~15 min on 2 cores)"
"$TESTENV" up "$STATE/cluster" >/dev/null
KUBECTL=$("$TESTENV" path kubectl)
kc() { "$KUBECTL" "$@"; }

echo "==> operator binary"
if [ -n "${KMS_LOCAL_BIN:-}" ]; then
  BIN=$KMS_LOCAL_BIN
else
  cargo build --quiet --bin kms-operator
  BIN=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/debug/kms-operator
fi
# kubectl and the CLI as its plugin, for `eval "$(scripts/local.sh env)"`.
mkdir -p "$STATE/bin"
ln -sf "$KUBECTL" "$STATE/bin/kubectl"
ln -sf "$BIN" "$STATE/bin/kubectl-kms"

echo "==> CRDs"
"$BIN" crds | kc apply --server-side --force-conflicts --field-manager=kms-operator-local -f - >/dev/null
kc get namespace "$OPERATOR_NS" >/dev/null 2>&1 || kc create namespace "$OPERATOR_NS" >/dev/null
# The KMS of resources that name none: the dev KMS.
kc -n "$OPERATOR_NS" create configmap kms-config --from-literal=hostAPI="http://$KMS_ADDR/api" \
  --dry-run=client -o yaml | kc apply -f - >/dev/null

echo "==> dev KMS on http://$KMS_ADDR"
if ! running "$STATE/devserver.pid"; then
  nohup "$BIN" dev-server --addr "$KMS_ADDR" --seed docs/examples/dev-seed.yaml \
    --data-dir "$STATE/kms-data" --kubeconfig "$KUBECONFIG" >"$STATE/devserver.log" 2>&1 &
  echo $! >"$STATE/devserver.pid"
  for _ in $(seq 1 100); do grep -q "listening on" "$STATE/devserver.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "listening on" "$STATE/devserver.log" || { cat "$STATE/devserver.log" >&2; echo "dev server did not start" >&2; exit 1; }
fi

echo "==> $REPLICAS operator replica(s)"
for i in $(seq 0 $((REPLICAS - 1))); do
  pidf=$STATE/operator-$i.pid
  running "$pidf" && continue
  nohup "$BIN" --log-format text run --pod-name "kms-operator-$i" --pod-namespace "$OPERATOR_NS" --expected-replicas "$REPLICAS" \
    --health-addr "127.0.0.1:$((HEALTH_PORT + i))" --metrics-addr "127.0.0.1:$((METRICS_PORT + i))" \
    >"$STATE/operator-$i.log" 2>&1 &
  echo $! >"$pidf"
done

echo "==> examples"
for f in credentials clustergenerator kmssecret; do
  kc apply -f "docs/examples/$f.yaml" >/dev/null
done

echo "==> waiting for the Secret default/demo-app"
for _ in $(seq 1 120); do
  kc -n default get secret demo-app >/dev/null 2>&1 && break
  sleep 0.5
done
if ! kc -n default get secret demo-app >/dev/null 2>&1; then
  echo "the Secret did not appear; see: scripts/local.sh logs" >&2
  kc -n default get kmssecret demo-app -o yaml >&2 || true
  exit 1
fi
kc get kmssecrets -A
echo
echo "Secret default/demo-app (synced from the dev KMS):"
kc -n default get secret demo-app -o go-template='{{range $k, $v := .data}}  {{$k}} = {{$v | base64decode}}{{"\n"}}{{end}}'
cat <<MSG

Everything keeps running. Try (docs/quickstart.md goes on from here):
  eval "\$(scripts/local.sh env)"   # kubectl and kubectl kms for this cluster
  kubectl get kmss -A
  kubectl kms status -A
  scripts/local.sh logs      # follow the logs
  scripts/local.sh down      # stop everything
MSG

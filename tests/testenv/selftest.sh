#!/usr/bin/env bash
# Self-test of the control plane script: up on a fresh directory, restart of
# each component keeps the data, down leaves no process behind and is safe
# twice.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
T="$HERE/testenv"
DIR=$(mktemp -d "${TMPDIR:-/tmp}/kms-testenv-selftest.XXXXXX")
trap '"$T" down "$DIR" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
fail() { echo "selftest: $*" >&2; exit 1; }

KUBECONFIG_PATH=$("$T" up "$DIR")
[ "$KUBECONFIG_PATH" = "$DIR/kubeconfig" ] || fail "up printed $KUBECONFIG_PATH"
K=$("$T" path kubectl)
kc() { "$K" --kubeconfig "$DIR/kubeconfig" "$@"; }
kc get --raw /version | grep -q "\"gitVersion\": \"$("$T" version)\"" || fail "unexpected /version"
kc create configmap survivor --from-literal=k=v >/dev/null

for component in apiserver etcd; do
  "$T" restart "$DIR" "$component"
  [ "$(kc get configmap survivor -o jsonpath='{.data.k}')" = v ] || fail "data lost after restarting $component"
done

"$T" down "$DIR"
if pgrep -f -- "$DIR" >/dev/null; then
  pgrep -af -- "$DIR" >&2
  fail "processes left after down"
fi
"$T" down "$DIR" || fail "second down failed"
echo "selftest: up, restart apiserver, restart etcd, down: ok"

#!/usr/bin/env bash
# Run kms-operator locally on an embedded default: a local control plane
# (tests/testenv), the CRDs and the examples of docs/examples.
#
#   scripts/local.sh          start (or resume) and show the synced objects
#   scripts/local.sh down     stop everything started here
#
# State lives in .local/ at the repository root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
STATE=$ROOT/.local
TESTENV=$ROOT/tests/testenv/testenv

if [ "${1:-}" = down ]; then
  "$TESTENV" down "$STATE/cluster"
  echo "stopped"
  exit 0
fi

mkdir -p "$STATE"
echo "==> control plane"
export KUBECONFIG=$("$TESTENV" up "$STATE/cluster")
KUBECTL=$("$TESTENV" path kubectl)
echo "==> operator binary"
cargo build --quiet --bin kms-operator
BIN=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/debug/kms-operator
echo "==> CRDs"
"$BIN" crds | "$KUBECTL" apply --server-side --field-manager=kms-operator-local -f - >/dev/null
echo "==> examples"
for f in credentials clustergenerator kmssecret; do
  "$KUBECTL" apply -f "docs/examples/$f.yaml" >/dev/null
done
"$KUBECTL" get kmssecrets,kmspushsecrets,kmsdynamicsecrets -A
cat <<MSG

The control plane runs; use it with:
  export KUBECONFIG=$KUBECONFIG
  alias kubectl=$KUBECTL
Not built yet: the dev KMS (issue "dev server, core") and the operator's
"run" command (issue "KmsSecret end to end"); until they land the examples
are stored but not synced. Stop with: scripts/local.sh down
MSG

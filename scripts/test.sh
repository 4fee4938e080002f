#!/usr/bin/env bash
# Every check CI runs: formatting, lints, the control-plane self-test, and the
# unit and integration tests against a real kube-apiserver + etcd.
#
# Uses the cluster of $KUBECONFIG when it is set; otherwise starts a local
# control plane (tests/testenv) for this run and stops it afterwards.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

declare -a TIMES=()
phase() {
  local name=$1; shift
  local start=$SECONDS
  echo "==> $name"
  "$@"
  TIMES+=("$(printf '%-28s %4ds' "$name" $((SECONDS - start)))")
}
summary() {
  echo "==> time per phase"
  printf '    %s\n' "${TIMES[@]}"
}
trap summary EXIT

phase "cargo fmt --check" cargo fmt --all -- --check
phase "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
# The node suite is `test = false` (it needs a node): --all-targets leaves it
# out, so it is linted on its own here, before the node phase builds it.
phase "cargo clippy (node suite)" cargo clippy -p kms-operator --test node --locked -- -D warnings
# The release build leaves the dev KMS out: it must build and lint alone.
phase "cargo clippy (release features)" cargo clippy -p kms-operator --no-default-features --locked -- -D warnings
# Advisories (offline, deny/advisory-db.tar.xz), licences and sources of
# every crate (cargo deny), and the GitHub workflows (actionlint).
phase "supply chain" scripts/supply-chain.sh
# The chart's alert rules as rendered (tests/prometheus/rules.yaml; a cargo
# test checks the copy is current): valid, and each alert's unit tests.
if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ]; then
  tests/testenv/testenv packages
fi
PROMTOOL=$(command -v promtool || true)
[ -n "$PROMTOOL" ] || { echo "promtool is required: the Debian package prometheus (as root, tests/testenv/testenv packages installs it)" >&2; exit 1; }
phase "promtool check rules" "$PROMTOOL" check rules tests/prometheus/rules.yaml
phase "promtool test rules" sh -c "cd tests/prometheus && '$PROMTOOL' test rules alerts.test.yaml"
# The oracle of the Go-template differential test: real Go renders the
# corpus, and it must render it as tests/gotemplate/expected.json says
# (template/tests/gotemplate.rs compares our engine with that file).
phase "Go template oracle" tests/gotemplate/check.sh
phase "build control plane" tests/testenv/testenv build

if [ -z "${KUBECONFIG:-}" ]; then
  TESTENV_DIR=$(mktemp -d "${TMPDIR:-/tmp}/kms-operator-test.XXXXXX")
  trap 'tests/testenv/testenv down "$TESTENV_DIR" >/dev/null 2>&1 || true; rm -rf "$TESTENV_DIR"; summary' EXIT
  phase "start control plane" tests/testenv/testenv up "$TESTENV_DIR"
  export KUBECONFIG="$TESTENV_DIR/kubeconfig"
fi
KUBECTL=$(tests/testenv/testenv path kubectl)
echo "==> tests run against kube-apiserver $("$KUBECTL" get --raw /version | sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p') at $("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')"

phase "control plane self-test" tests/testenv/selftest.sh
phase "cargo test" cargo test --workspace --locked
# Tests that assert a latency bound (instant updates, shard hand-over) are
# #[ignore]d above and run here one at a time, so the bound is the operator's
# and not the cost of sharing two cores with every other test.
# (`--workspace`, as above: the same features, so nothing is rebuilt.)
phase "timing tests (alone)" cargo test --workspace --locked --test integration -- --ignored --test-threads=1 --nocapture

# The oldest supported Kubernetes minor (the newest is the control plane
# above): a control plane of its last patch release (pinned in
# tests/testenv/k8s/, built from Go modules and cached like the newest),
# then the CRD tests and a smoke subset on it (scripts/k8s-matrix.sh, which
# runs every minor when given none). KMS_K8S_OLDEST=0 skips it.
if [ "${KMS_K8S_OLDEST:-1}" != 0 ]; then
  OLDEST=$(tests/testenv/testenv versions | head -1)
  phase "Kubernetes $OLDEST: build" env KMS_TESTENV_K8S="$OLDEST" tests/testenv/testenv build etcd kube-apiserver kubectl
  phase "Kubernetes $OLDEST: crds + smoke" scripts/k8s-matrix.sh "$OLDEST"
fi

# The node suite (tests/node): the chart's pods on a real node (containerd,
# kubelet, scheduler, controller-manager, kube-proxy, CoreDNS) beside a
# control plane of its own, the operator image built from the release
# binary. KMS_NODE=0 skips it (it needs root and the Debian packages
# containerd, runc and iptables, which `testenv up --node` installs).
if [ "${KMS_NODE:-1}" != 0 ]; then
  NODE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/kms-operator-node.XXXXXX")
  NODE_SNAPSHOT=$NODE_DIR.host-before
  node_down() {
    tests/testenv/testenv down "$NODE_DIR" >/dev/null 2>&1 || true
  }
  trap 'node_down; [ -n "${TESTENV_DIR:-}" ] && tests/testenv/testenv down "$TESTENV_DIR" >/dev/null 2>&1; summary' EXIT
  phase "node: build" tests/testenv/testenv build node
  # One node per machine: a second run of this script waits here for the
  # first one's node section (the lock goes with its holder, killed or not),
  # then tidies the node of a run that was killed before `testenv down`
  # (nothing of it runs any more, but its mounts, links and chains stay), so
  # the snapshot records the host as it is without any node.
  exec 9>/run/kms-testenv-node.lock
  flock -n 9 || { echo "==> node: waiting for another run's node"; flock 9; }
  for stale in "${TMPDIR:-/tmp}"/kms-operator-node.*; do
    [ -d "$stale/node" ] && [ "$stale" != "$NODE_DIR" ] || continue
    tests/testenv/testenv status "$stale" 2>/dev/null | grep -q ' running ' && continue
    echo "==> node: tidying the node a killed run left in $stale"
    tests/testenv/testenv down "$stale" || true
    rm -rf "$stale" "$stale.host-before"
  done
  tests/testenv/node-selftest.sh snapshot "$NODE_SNAPSHOT"
  phase "node: start" tests/testenv/testenv up "$NODE_DIR" --node
  phase "node: guard" tests/testenv/node-selftest.sh guard "$NODE_DIR"
  # The release as users get it (scripts/release.sh): this version, the same
  # build labelled as the release before it (the upgrade scenario's start),
  # and this version again (the image must be the same: reproducible). The
  # first two are pushed to the node's registry, which containerd pulls from.
  REGISTRY=$(tests/testenv/testenv registry "$NODE_DIR")
  VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
  DIST=$NODE_DIR.dist
  # Signed with a key made for the run (the release workflow signs keyless);
  # the node suite verifies the signature in the registry.
  . scripts/lib/tools.sh
  export COSIGN=$(go_tool cosign "$COSIGN_MODULE" "$COSIGN_VERSION") COSIGN_PASSWORD=
  mkdir -p "$DIST" && (cd "$DIST" && "$COSIGN" generate-key-pair --output-key-prefix cosign >/dev/null)
  phase "release $VERSION" scripts/release.sh "$VERSION" --out "$DIST/$VERSION" --push "$REGISTRY" --sign-key "$DIST/cosign.key"
  phase "release $VERSION-rc.1" scripts/release.sh "$VERSION-rc.1" --out "$DIST/$VERSION-rc.1" --push "$REGISTRY"
  phase "release $VERSION again" scripts/release.sh "$VERSION" --out "$DIST/$VERSION-again"
  # The dev KMS the scenarios deploy: the CLI's build (it has dev-server).
  phase "node: dev KMS image" scripts/image.sh --binary "${CARGO_TARGET_DIR:-target}/release/kms-operator" --tag dev --import "$NODE_DIR"
  phase "node suite" env KUBECONFIG="$NODE_DIR/kubeconfig" KMS_RELEASE_DIR="$DIST" KMS_COSIGN="$COSIGN" \
    KMS_RELEASE_VERSION="$VERSION" KMS_RELEASE_PREVIOUS="$VERSION-rc.1" \
    cargo test --workspace --locked --test node -- --test-threads=1 --nocapture
  phase "node: stop" tests/testenv/testenv down "$NODE_DIR"
  phase "node: host clean" tests/testenv/node-selftest.sh clean "$NODE_SNAPSHOT"
  rm -rf "$NODE_DIR" "$NODE_SNAPSHOT" "$DIST"
fi

# The chaos suite's short profile (about 5 minutes, at least 30 faults) on the
# same control plane, which it also restarts (kube-apiserver, etcd) when it is
# a tests/testenv one. Debug build: `cargo test` above already built the
# operator in that profile, and the run is bound by lease timings and fault
# holds, not by CPU (docs/chaos.md). KMS_CHAOS=0 skips it. The seed is
# fixed (2: every fault kind, and the schedule that exposed the lease and
# budget defects) so a red run can be replayed exactly; KMS_CHAOS_SEED=<n>
# picks another, KMS_CHAOS_SEED=random draws one (printed with the report).
if [ "${KMS_CHAOS:-1}" != 0 ]; then
  CHAOS_ARGS=(--profile short --kubeconfig "$KUBECONFIG" --report target/chaos/short-report.json)
  CHAOS_SEED=${KMS_CHAOS_SEED:-2}
  if [ "$CHAOS_SEED" != random ]; then CHAOS_ARGS+=(--seed "$CHAOS_SEED"); fi
  phase "build chaos suite" cargo build --locked -p kms-chaos -p kms-operator
  phase "chaos (short profile)" "${CARGO_TARGET_DIR:-target}/debug/kms-chaos" "${CHAOS_ARGS[@]}"
fi

#!/usr/bin/env bash
# The Kubernetes version matrix: for each minor (default: every one pinned,
# `tests/testenv/testenv versions`), a control plane of that minor's last
# patch release, then
#
#   crds   the `crds` integration tests (the CRDs install with server-side
#          apply; valid resources accepted, each invalid one refused with
#          its rule's own message; defaults, immutability, printer columns)
#          and the chart's manifests through `--dry-run=server`
#          (helm::values_matrix…, helm::chart_crds…);
#   smoke  one KmsSecret, one KmsPushSecret, one KmsDynamicSecret, shard
#          Leases split among three replicas, auto-reload of workloads
#          (one integration test of each).
#
#   scripts/k8s-matrix.sh                 every pinned minor
#   scripts/k8s-matrix.sh 1.29 1.37       these
#
# Writes the results table (markdown) to target/k8s-matrix.md and prints it;
# exits non-zero when any minor failed. Logs: target/k8s-matrix/<minor>.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -gt 0 ] || set -- $(tests/testenv/testenv versions)
export CARGO_TERM_COLOR=never

CRDS=(crds:: helm::values_matrix_renders_as_designed_and_the_api_server_accepts_it
  helm::chart_crds_are_the_generated_crds_kept_on_uninstall)
SMOKE=(kms_secret::syncs_follows_changes_and_repairs_the_secret
  push::pushes_follows_the_source_and_deletes_only_its_own_keys
  dynamic::a_lease_is_created_once_and_renewed_without_touching_the_secret
  sharding::three_replicas_split_the_shards_and_sync_everything_once
  reload::workloads_roll_exactly_when_a_secret_they_use_changes)

mkdir -p target/k8s-matrix
# Build the tests once, before any control plane runs.
cargo test --locked --test integration --no-run >/dev/null 2>&1 ||
  cargo test --locked --test integration --no-run

# Runs the named tests against $KUBECONFIG; "ok (N tests)" or "FAILED …".
run_tests() {
  local log=$1; shift
  local out
  if out=$(cargo test --locked --test integration -- --test-threads=2 "$@" 2>&1); then
    echo "$out" >> "$log"
    echo "ok ($(echo "$out" | sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' | tail -1) tests)"
  else
    echo "$out" >> "$log"
    echo "FAILED: $(echo "$out" | sed -n 's/^    \([a-z_:]*\)$/\1/p' | tr '\n' ' ')"
  fi
}

rows=() failed=0
for minor in "$@"; do
  export KMS_TESTENV_K8S=$minor
  log=target/k8s-matrix/$minor.log
  : > "$log"
  start=$SECONDS
  version=$(tests/testenv/testenv version)
  echo "==> Kubernetes $version" >&2
  tests/testenv/testenv build testenv-ctl etcd kube-apiserver kubectl helm >> "$log" 2>&1
  built=$((SECONDS - start))
  dir=$(mktemp -d "${TMPDIR:-/tmp}/kms-matrix-$minor.XXXXXX")
  if tests/testenv/testenv up "$dir" >> "$log" 2>&1; then
    export KUBECONFIG=$dir/kubeconfig
    served=$("$(tests/testenv/testenv path kubectl)" get --raw /version | sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p')
    t0=$SECONDS
    crds=$(run_tests "$log" "${CRDS[@]}")
    t1=$SECONDS
    smoke=$(run_tests "$log" "${SMOKE[@]}")
    t2=$SECONDS
    unset KUBECONFIG
  else
    served="-" crds="FAILED: control plane did not start" smoke="-" t0=$SECONDS t1=$SECONDS t2=$SECONDS
  fi
  tests/testenv/testenv down "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
  case "$crds $smoke" in *FAIL*) failed=1 ;; esac
  rows+=("| $minor | $served | $crds | $smoke | ${built} s | $((t1 - t0)) s | $((t2 - t1)) s |")
  echo "    $minor: crds $crds, smoke $smoke" >&2
done

{
  echo "| minor | API server | CRDs, CEL rules, chart dry-run | smoke | build | crds | smoke |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee target/k8s-matrix.md
exit $failed

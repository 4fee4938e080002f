#!/usr/bin/env bash
# Regenerate the committed artifacts from the Rust types: crds/<plural>.yaml,
# and their copies in the Helm chart (helm/secrets-operator/files/crds/, which
# the chart's CRD template renders with `helm.sh/resource-policy: keep`).
# Tests fail when either is stale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rm -f crds/*.yaml
cargo run --quiet --bin kms-operator -- crds --out-dir crds
echo "crds/ regenerated"
chart_crds=helm/secrets-operator/files/crds
mkdir -p "$chart_crds"
rm -f "$chart_crds"/*.yaml
cp crds/*.yaml "$chart_crds"/
echo "$chart_crds/ updated"

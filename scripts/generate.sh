#!/usr/bin/env bash
# Regenerate the committed artifacts: crds/<plural>.yaml from the Rust types,
# their copies in the Helm chart (helm/secrets-operator/files/crds/, which
# the chart's CRD template renders with `helm.sh/resource-policy: keep`), and
# the chart's alert rules as rendered (tests/prometheus/rules.yaml, for
# promtool). Tests fail when any is stale.
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
KMS_BLESS=1 cargo test --quiet --test integration -- --exact helm::the_committed_alert_rules_are_what_the_chart_renders >/dev/null
echo "tests/prometheus/rules.yaml regenerated"

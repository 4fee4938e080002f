#!/usr/bin/env bash
# Plot the dashboard's main queries into docs/img/panels-*.png from the
# query results of the node scenario s9 (target/node-prometheus/panels.json;
# plots of what Prometheus answered, not screenshots of Grafana):
#
#   KMS_TESTENV_CACHE=... tests/testenv/testenv up DIR --node
#   scripts/image.sh --tag dev --import DIR
#   KUBECONFIG=DIR/kubeconfig cargo test --test node -- --nocapture s9
#   scripts/plots.sh
#
# matplotlib is installed into a virtualenv under target/ (from PyPI).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
data=target/node-prometheus/panels.json
[ -f "$data" ] || { echo "$data is missing: run the node scenario s9 first (see the header of this script)" >&2; exit 1; }
venv=target/plots-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "matplotlib==3.11.2"
fi
"$venv/bin/python" scripts/plots.py "$data" docs/img

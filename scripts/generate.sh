#!/usr/bin/env bash
# Regenerate the committed artifacts from the Rust types: crds/<plural>.yaml.
# A unit test fails when they are stale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rm -f crds/*.yaml
cargo run --quiet --bin kms-operator -- crds --out-dir crds
echo "crds/ regenerated"

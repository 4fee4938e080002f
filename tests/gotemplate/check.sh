#!/bin/sh
# CI's check that tests/gotemplate/expected.json is what real Go renders:
# runs the oracle (main.go: text/template + Sprig v3.3.0) over the corpus
# and compares every case with the stored result, except the cases marked
# "deliberate" (functions that are random or read the environment give
# another answer on every run; the Rust engine refuses them). The Rust side
# of the differential test (template/tests/gotemplate.rs) reads the stored
# results, so the two together compare this engine with Go in every run.
set -eu
cd "$(dirname "$0")"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout 600 go run . corpus.json > "$out"
python3 - "$out" <<'PY'
import json, sys
corpus = json.load(open("corpus.json"))
deliberate = {c["name"] for c in corpus["cases"] if "deliberate" in c}
fresh = {r["name"]: r for r in json.load(open(sys.argv[1]))}
stored = {r["name"]: r for r in json.load(open("expected.json"))}
if fresh.keys() != stored.keys():
    sys.exit(f"the oracle's cases differ from expected.json: {sorted(fresh.keys() ^ stored.keys())[:10]}")
changed = [n for n in fresh if n not in deliberate and fresh[n] != stored[n]]
if changed:
    sys.exit(f"{len(changed)} case(s) render differently in Go than expected.json says "
             f"(run tests/gotemplate/bless.sh and review): {changed[:10]}")
print(f"Go oracle: {len(fresh)} cases, {len(fresh) - len(deliberate)} compared, all as stored")
PY

#!/bin/sh
# Rebuilds the expected outputs of the differential Go-template test with
# real Go: text/template and Sprig v3.3.0 (the oracle, main.go), from the
# corpus written by gen_corpus.py. Needs Go and Python 3.
set -eu
cd "$(dirname "$0")"
python3 gen_corpus.py > corpus.json
timeout 600 go run . corpus.json > expected.json
echo "$(grep -c '"name"' expected.json) cases blessed"

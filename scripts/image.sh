#!/usr/bin/env bash
# The operator image without a registry or an image tool:
#
#   scripts/image.sh [--tag TAG] [--import DIR] [--binary PATH]
#
# builds localhost/kms-operator:TAG (default `dev`) from the release binary
# (built when missing or stale, or PATH; CARGO_TARGET_DIR is honoured), with what the
# Dockerfile's distroless base gives it: the C runtime libraries the binary
# links, a CA bundle, the non-root user 65532, and the Dockerfile's
# entrypoint, default arguments, user and exposed ports (read from the
# Dockerfile, so the two cannot drift). With --import DIR it is imported into
# the node of the testenv directory DIR (`tests/testenv/testenv up DIR
# --node`); without, the tarball's path is printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TAG=dev
IMPORT=
BINARY=
while [ $# -gt 0 ]; do
  case $1 in
    --tag) TAG=$2; shift 2 ;;
    --import) IMPORT=$2; shift 2 ;;
    --binary) BINARY=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "$BINARY" ]; then
  echo "image.sh: building the release binary" >&2
  cargo build --release --locked --bin kms-operator >&2
  BINARY=$TARGET/release/kms-operator
fi

. scripts/lib/image-root.sh
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
image_root "$BINARY" "$ROOT"

OUT=$TARGET/images/kms-operator-$TAG.tar
mkdir -p "$(dirname "$OUT")"
tests/testenv/testenv image -root "$ROOT" -tag "localhost/kms-operator:$TAG" \
  -entrypoint "$ENTRYPOINT_JSON" -cmd "${CMD_JSON:-[]}" -user "$USER_ID" -expose "$EXPOSE" -out "$OUT" >&2
if [ -n "$IMPORT" ]; then
  tests/testenv/testenv import "$IMPORT" "$OUT" >&2
  echo "image.sh: localhost/kms-operator:$TAG imported into the node of $IMPORT" >&2
else
  echo "$OUT"
fi

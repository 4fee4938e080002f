#!/usr/bin/env bash
# The operator image without a registry or an image tool:
#
#   scripts/image.sh [--tag TAG] [--import DIR]
#
# builds localhost/kms-operator:TAG (default `dev`) from the release binary
# (built when missing or stale; CARGO_TARGET_DIR is honoured), with what the
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
while [ $# -gt 0 ]; do
  case $1 in
    --tag) TAG=$2; shift 2 ;;
    --import) IMPORT=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

TARGET=${CARGO_TARGET_DIR:-target}
echo "image.sh: building the release binary" >&2
cargo build --release --locked --bin kms-operator >&2
BIN=$TARGET/release/kms-operator

# What the Dockerfile declares for the final image.
dockerfile_json() { # INSTRUCTION: its exec-form JSON array, from the last stage
  sed -n "s/^$1 \(\[.*\]\)\s*$/\1/p" Dockerfile | tail -1
}
ENTRYPOINT_JSON=$(dockerfile_json ENTRYPOINT)
CMD_JSON=$(dockerfile_json CMD)
USER_ID=$(sed -n 's/^USER \(.*\)$/\1/p' Dockerfile | tail -1)
EXPOSE=$(sed -n 's/^EXPOSE \(.*\)$/\1/p' Dockerfile | tail -1 | tr ' ' ',')
COPY_DEST=$(sed -n 's/^COPY --from=builder \S* \(\S*\)$/\1/p' Dockerfile | tail -1)
[ -n "$ENTRYPOINT_JSON" ] && [ -n "$USER_ID" ] && [ -n "$COPY_DEST" ] ||
  { echo "image.sh: cannot read ENTRYPOINT, USER and the binary's path from the Dockerfile" >&2; exit 1; }

ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
install -D -m 0755 "$BIN" "$ROOT$COPY_DEST"
# The shared libraries it links (libc, libm, libgcc_s, the loader).
for lib in $(ldd "$BIN" | grep -o '/[^ ]*'); do
  cp --parents -L "$lib" "$ROOT/"
done
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$ROOT/tmp" && chmod 1777 "$ROOT/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ROOT/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ROOT/etc/group"
mkdir -p "$ROOT/home/nonroot"

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

#!/usr/bin/env bash
# A release of kms-operator, as users consume it:
#
#   scripts/release.sh VERSION [--out DIR] [--push REGISTRY] [--repo-url URL]
#
# writes into DIR (default dist/VERSION/):
#   image/                                 the image as an OCI image layout (index.json's one
#                                          entry is the digest VERSION resolves to); the binary,
#                                          without the dev KMS, at /usr/local/bin/kms-operator
#   kms-operator-VERSION-image.oci.tar     the same layout as one tar
#   secrets-operator-VERSION.tgz, index.yaml   the chart and a classic chart repository
#   crds.yaml                              every CRD, for `kubectl apply`
#   kms-operator-VERSION-linux-ARCH.tar.gz     the CLI (with `kubectl-kms` for kubectl's
#                                          plugin lookup)
#   sbom.cdx.json                          CycloneDX SBOM of the binary: every crate, version,
#                                          licence
#   kms-operator.krew.yaml                 krew plugin manifest of `kubectl kms`
#   RELEASE_NOTES.md                       from CHANGELOG.md, with the digest
#   SHA256SUMS                             of every file above
#
# The image is reproducible: the same commit gives the same digest (files
# and the image dated at the commit's time, entries sorted, no gzip name or
# time). VERSION is the workspace version in Cargo.toml, or a pre-release of
# it (2.0.0-rc.1 of 2.0.0: the same build, labelled so).
#
# --push REGISTRY (host:port[/namespace]) pushes the image as
# REGISTRY/kms-operator:VERSION and the chart as the OCI artifact
# oci://REGISTRY/charts/secrets-operator:VERSION; a loopback registry is
# spoken to over plain HTTP, others with the credentials of `docker login`
# / `helm registry login`. With --push, --sign-key KEY signs the pushed
# image with that cosign key (COSIGN_PASSWORD). --repo-url sets the URL of
# the chart in index.yaml (default: relative, served beside index.yaml).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
VERSION=
OUT=
PUSH=
REPO_URL=
SIGN_KEY=
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --push) PUSH=$2; shift 2 ;;
    --sign-key) SIGN_KEY=$2; shift 2 ;;
    --repo-url) REPO_URL=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
    *) [ -z "$VERSION" ] || { echo "release.sh: one VERSION only" >&2; exit 2; }; VERSION=$1; shift ;;
  esac
done
[ -n "$VERSION" ] || { usage >&2; exit 2; }
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
  { echo "release.sh: $VERSION is not a version (MAJOR.MINOR.PATCH[-PRERELEASE], no v)" >&2; exit 2; }
WORKSPACE_VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
case $VERSION in
  "$WORKSPACE_VERSION"|"$WORKSPACE_VERSION"-*) ;;
  *) echo "release.sh: $VERSION is not the workspace version $WORKSPACE_VERSION (Cargo.toml) or a pre-release of it; bump the version there first" >&2; exit 2 ;;
esac
OUT=${OUT:-dist/$VERSION}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TARGET=${CARGO_TARGET_DIR:-target}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
export KMS_OPERATOR_COMMIT=${KMS_OPERATOR_COMMIT:-$COMMIT}
SOURCE=https://github.com/hanzoai/kms-operator
# The platform built for: this machine's (the release workflow builds each
# on its own runner).
case ${ARCH:-$(uname -m)} in
  x86_64|amd64) ARCH=amd64 TRIPLE=x86_64-unknown-linux-gnu ;;
  aarch64|arm64) ARCH=arm64 TRIPLE=aarch64-unknown-linux-gnu ;;
  *) echo "release.sh: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
step() { echo "release.sh: $*" >&2; }

# The release tool (OCI layout, push, SBOM), built from release/ once per
# source.
TOOLS=${KMS_TOOLS_CACHE:-$HOME/.cache/kms-operator-tools}
mkdir -p "$TOOLS"
TOOL_STAMP=$( (go version; cat release/go.mod release/go.sum release/*.go) | sha256sum | cut -c1-16)
TOOL=$TOOLS/kms-release-$TOOL_STAMP
if [ ! -x "$TOOL" ]; then
  step "building the release tool"
  (cd release && go build -trimpath -o "$TOOL.tmp" .) && mv "$TOOL.tmp" "$TOOL"
fi
HELM=${HELM:-$(command -v helm || tests/testenv/testenv path helm)}
[ -x "$HELM" ] || { echo "release.sh: helm is required (tests/testenv/testenv build helm)" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# 1. The binaries: the image's without the dev KMS, the CLI's with it.
step "building the release binaries (commit $COMMIT)"
cargo build --release --locked -p kms-operator --no-default-features --bin kms-operator >&2
install -m 0755 "$TARGET/release/kms-operator" "$WORK/kms-operator-image"
cargo build --release --locked -p kms-operator --bin kms-operator >&2
install -m 0755 "$TARGET/release/kms-operator" "$WORK/kms-operator"
if "$WORK/kms-operator-image" dev-server --help >/dev/null 2>&1; then
  echo "release.sh: the image's binary has a dev-server command" >&2; exit 1
fi

# 2. The image.
step "writing the image (OCI layout)"
. scripts/lib/image-root.sh
image_root "$WORK/kms-operator-image" "$WORK/root"
labels=(
  -label "org.opencontainers.image.version=$VERSION"
  -label "org.opencontainers.image.revision=$COMMIT"
  -label "org.opencontainers.image.source=$SOURCE"
  -label "org.opencontainers.image.licenses=Apache-2.0"
  -label "org.opencontainers.image.title=kms-operator"
)
DIGEST=$("$TOOL" image -root "$WORK/root" -out "$OUT/image" -tag "$VERSION" -arch "$ARCH" \
  -entrypoint "$ENTRYPOINT_JSON" -cmd "${CMD_JSON:-[]}" -user "$USER_ID" -expose "$EXPOSE" \
  -epoch "$SOURCE_DATE_EPOCH" "${labels[@]}")
tar_reproducibly() { # OUTPUT DIR: DIR's contents as a tar, sorted, dated, owned by root
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    --format=gnu -C "$2" -cf "$1" .
}
tar_reproducibly "$OUT/kms-operator-$VERSION-image.oci.tar" "$OUT/image"

# 3. The chart and its classic repository; the CRDs.
step "packaging the chart"
cp -r helm/secrets-operator "$WORK/chart"
# Artifact Hub's image annotation names this version's image.
sed -i "s|^\(      image: ghcr.io/hanzoai/kms-operator:\).*|\1$VERSION|" "$WORK/chart/Chart.yaml"
"$HELM" package "$WORK/chart" --version "$VERSION" --app-version "$VERSION" -d "$OUT" >&2
if [ -n "$REPO_URL" ]; then
  "$HELM" repo index "$OUT" --url "$REPO_URL" >&2
else
  "$HELM" repo index "$OUT" >&2
fi
"$WORK/kms-operator" crds >"$OUT/crds.yaml"

# 4. The CLI.
step "packing the CLI"
mkdir -p "$WORK/cli"
install -m 0755 "$WORK/kms-operator" "$WORK/cli/kms-operator"
ln "$WORK/cli/kms-operator" "$WORK/cli/kubectl-kms"
cp LICENSE README.md "$WORK/cli/"
CLI=kms-operator-$VERSION-linux-$ARCH.tar.gz
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  --format=gnu -C "$WORK/cli" -cf - . | gzip -n -9 >"$OUT/$CLI"

# 5. SBOM, krew manifest, release notes.
step "writing the SBOM, the krew manifest and the release notes"
cargo metadata --format-version 1 --locked --no-default-features \
  --filter-platform "$TRIPLE" >"$WORK/metadata.json"
"$TOOL" sbom -metadata "$WORK/metadata.json" -package kms-operator -out "$OUT/sbom.cdx.json" \
  -epoch "$SOURCE_DATE_EPOCH"
CLI_SHA=$(sha256sum "$OUT/$CLI" | cut -d' ' -f1)
cat >"$OUT/kms-operator.krew.yaml" <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: kms
spec:
  version: v$VERSION
  homepage: $SOURCE
  shortDescription: Status, migration and sync of kms-operator resources
  description: |
    kubectl kms is the kms-operator CLI: the status of shards and resources
    (kubectl kms status), the conversion of the Go operators' manifests
    (kubectl kms migrate), and the CRDs (kubectl kms crds).
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: $ARCH
      uri: $SOURCE/releases/download/v$VERSION/$CLI
      sha256: $CLI_SHA
      bin: kubectl-kms
YAML
SECTION=${VERSION%%-*}
{
  # Links into the repository become links to the tagged tree.
  awk -v v="$SECTION" '
    /^## / { if (on) exit; if (index($0, "## " v) == 1) { on = 1; next } }
    on { print }
  ' CHANGELOG.md | sed "s|](docs/|]($SOURCE/blob/v$VERSION/docs/|g"
  cat <<NOTES

## Verify

Image: \`ghcr.io/hanzoai/kms-operator:$VERSION\`, digest \`$DIGEST\`:

\`\`\`sh
helm install kms-operator oci://ghcr.io/hanzoai/charts/secrets-operator --version $VERSION \\
  --set controllerManager.manager.image.digest=$DIGEST
cosign verify ghcr.io/hanzoai/kms-operator@$DIGEST \\
  --certificate-identity-regexp '^https://github.com/hanzoai/kms-operator/' \\
  --certificate-oidc-issuer https://token.actions.githubusercontent.com
sha256sum -c SHA256SUMS
\`\`\`
NOTES
} >"$OUT/RELEASE_NOTES.md"
grep -q . "$OUT/RELEASE_NOTES.md" || { echo "release.sh: no CHANGELOG.md section for $SECTION" >&2; exit 1; }

# 6. Checksums of everything above.
(cd "$OUT" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | sort |
  xargs sha256sum >SHA256SUMS)

# 7. Push.
if [ -n "$PUSH" ]; then
  step "pushing to $PUSH"
  "$TOOL" push -layout "$OUT/image" -tag "$VERSION" -to "$PUSH/kms-operator:$VERSION" >&2
  plain=()
  case ${PUSH%%/*} in localhost|localhost:*|127.*) plain=(--plain-http) ;; esac
  "$HELM" push "$OUT/secrets-operator-$VERSION.tgz" "oci://$PUSH/charts" "${plain[@]}" >&2
  if [ -n "$SIGN_KEY" ]; then
    # A key of your own (the release workflow signs keyless instead); no
    # transparency log entry for a registry that only this machine sees.
    . scripts/lib/tools.sh
    COSIGN=${COSIGN:-$(go_tool cosign "$COSIGN_MODULE" "$COSIGN_VERSION")}
    http=()
    [ ${#plain[@]} -gt 0 ] && http=(--allow-http-registry)
    step "signing $PUSH/kms-operator@$DIGEST"
    COSIGN_PASSWORD=${COSIGN_PASSWORD:-} "$COSIGN" sign --key "$SIGN_KEY" --tlog-upload=false \
      "${http[@]}" --yes "$PUSH/kms-operator@$DIGEST" >&2
  fi
fi
step "done: $OUT (image $DIGEST)"
echo "$DIGEST"

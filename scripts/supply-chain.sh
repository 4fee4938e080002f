#!/usr/bin/env bash
# The supply-chain checks, offline:
#
#   scripts/supply-chain.sh            cargo deny check (advisories, licences, sources, bans)
#                                      against the RustSec snapshot in deny/, and actionlint
#                                      on .github/workflows
#   scripts/supply-chain.sh refresh DIR   replace the snapshot with DIR, a checkout of the
#                                      public advisory database
#
# The tools are built from crates.io and the Go module proxy at pinned
# versions, once, and cached under ~/.cache/kms-operator-tools/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO_DENY_VERSION=0.20.2
TOOLS=${KMS_TOOLS_CACHE:-$HOME/.cache/kms-operator-tools}
SNAPSHOT=deny/advisory-db.tar.xz

if [ "${1:-}" = refresh ]; then
  src=${2:?usage: scripts/supply-chain.sh refresh DIR}
  [ -d "$src/crates" ] || { echo "supply-chain.sh: $src has no crates/ directory" >&2; exit 2; }
  commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/rustsec-advisory-db"
  cp -r "$src"/crates "$src"/rust "$src"/LICENSE* "$tmp/rustsec-advisory-db/"
  [ -d "$src/LICENSES" ] && cp -r "$src/LICENSES" "$tmp/rustsec-advisory-db/"
  printf 'commit %s, taken %s\n' "$commit" "$(date -u +%F)" >"$tmp/rustsec-advisory-db/SNAPSHOT"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp" -cf - rustsec-advisory-db |
    xz -9 >"$SNAPSHOT"
  echo "supply-chain.sh: $SNAPSHOT now holds commit $commit; update deny/README.md"
  exit 0
fi

mkdir -p "$TOOLS"
DENY=$TOOLS/cargo-deny-$CARGO_DENY_VERSION/bin/cargo-deny
if [ ! -x "$DENY" ]; then
  echo "supply-chain.sh: building cargo-deny $CARGO_DENY_VERSION (once)" >&2
  start=$SECONDS
  cargo install --locked --quiet cargo-deny --version "$CARGO_DENY_VERSION" \
    --root "$TOOLS/cargo-deny-$CARGO_DENY_VERSION"
  echo "supply-chain.sh: built cargo-deny in $((SECONDS - start))s" >&2
fi
. scripts/lib/tools.sh
ACTIONLINT=$(go_tool actionlint "$ACTIONLINT_MODULE" "$ACTIONLINT_VERSION")

# The snapshot as the git repository cargo-deny fetches the database from:
# git rewrites the database's public URL (deny.toml) to the local
# repository, so the check runs the same with no network.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
tar -C "$WORK" -xJf "$SNAPSHOT"
DB=$WORK/rustsec-advisory-db
git -C "$DB" init -q -b main
git -C "$DB" -c user.name=snapshot -c user.email=snapshot@invalid add -A
git -C "$DB" -c user.name=snapshot -c user.email=snapshot@invalid commit -q -m snapshot
newest=$(grep -rhoE '^date = "[0-9-]+"' "$DB/crates" | sort | tail -1 | grep -oE '[0-9-]{10}')
echo "supply-chain.sh: advisory snapshot of $newest (its newest advisory; $(( ($(date +%s) - $(date -d "$newest" +%s)) / 86400 )) days old)"
URL=$(sed -n 's/^db-urls = \["\(.*\)"\]/\1/p' deny.toml)
sed -e "/^\[advisories\]/a db-path = \"$WORK/dbs\"" deny.toml >"$WORK/deny.toml"
GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0="url.file://$DB.insteadOf" GIT_CONFIG_VALUE_0="$URL" \
  "$DENY" deny --color never --config "$WORK/deny.toml" check --show-stats
"$ACTIONLINT" -no-color .github/workflows/*.yml
echo "supply-chain.sh: actionlint found nothing"

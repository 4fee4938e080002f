# Sourced by the scripts that need tools built from the Go module proxy:
#
#   go_tool NAME MODULE VERSION   the path of NAME built from MODULE@VERSION
#                                 (go install, stripped), once, cached under
#                                 ${KMS_TOOLS_CACHE:-~/.cache/kms-operator-tools}/NAME-VERSION
go_tool() {
  local name=$1 module=$2 version=$3
  local tools=${KMS_TOOLS_CACHE:-$HOME/.cache/kms-operator-tools}
  local path=$tools/$name-$version
  if [ ! -x "$path" ]; then
    echo "building $name $version (once)" >&2
    local start=$SECONDS
    mkdir -p "$tools"
    GOBIN="$tools/.$name-bin" go install -trimpath -ldflags "-s -w" "$module@$version" >&2
    mv "$tools/.$name-bin/$name" "$path"
    echo "built $name in $((SECONDS - start))s" >&2
  fi
  echo "$path"
}

# The versions the project uses.
ACTIONLINT_MODULE=github.com/rhysd/actionlint/cmd/actionlint
ACTIONLINT_VERSION=v1.7.12
COSIGN_MODULE=github.com/sigstore/cosign/v2/cmd/cosign
COSIGN_VERSION=v2.6.1

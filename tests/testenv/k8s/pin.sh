#!/usr/bin/env bash
# Pin the control plane of one Kubernetes release for the testenv:
#
#   tests/testenv/k8s/pin.sh v1.29.15
#
# writes tests/testenv/k8s/1.29/go.mod and go.sum: k8s.io/kubernetes at that
# release, every staging module (k8s.io/api, k8s.io/apiserver, ...) at the
# matching v0.x.y, and kube-apiserver, kubectl and etcd as tools, the etcd
# being the one that release's modules require. `testenv` builds from it
# when KMS_TESTENV_K8S=1.29 (see the testenv's header). The newest minor is
# pinned by tests/testenv/go.mod itself (it also builds the node).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 v1.MINOR.PATCH" >&2; exit 2; }
version=$1
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "$0: $version is not v1.MINOR.PATCH" >&2; exit 2; }
minor=${BASH_REMATCH[1]} patch=${BASH_REMATCH[2]}
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/1.$minor
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
mkdir -p "$dir"
cd "$dir"
# The staging modules: the `replace k8s.io/x => ./staging/...` lines of
# k8s.io/kubernetes's own go.mod at that release.
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
[ -f "$gomod" ] || { echo "$0: cannot download k8s.io/kubernetes@$version" >&2; exit 1; }
staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod" | sort -u)
{
  echo "module kms-operator.invalid/testenv-k8s-1-$minor"
  echo
  echo "go 1.24.0"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  for m in $staging; do echo "replace $m => $m v0.$minor.$patch"; done
  echo
  echo "tool ("
  echo "	go.etcd.io/etcd/server/v3"
  echo "	k8s.io/kubernetes/cmd/kube-apiserver"
  echo "	k8s.io/kubernetes/cmd/kubectl"
  echo ")"
} > go.mod
rm -f go.sum
go mod tidy
echo "pinned Kubernetes $version in $dir (etcd $(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' go.mod))"

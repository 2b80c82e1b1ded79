#!/usr/bin/env bash
# Builds the pinned test-control-plane binaries into bin/ from the Go module proxy. A binary is
# rebuilt only when its pinned version changes: the version is part of a stamp file next to it.
set -euo pipefail
# Each build says how long it took: the first one on a machine with empty Go caches pays for the
# module downloads and the shared Kubernetes packages, the later ones reuse them.
trap 'echo "make tools: $SECONDS s in all"' EXIT
# With names (make's rule for one tool), only those are built.
wanted=("$@")
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
mkdir -p "$bin"

# build NAME VERSION MODULE_DIR PACKAGE
wanted() {
  [[ ${#wanted[@]} -eq 0 || " ${wanted[*]} " == *" $1 "* ]]
}

build() {
  local name=$1 version=$2 dir=$3 pkg=$4
  local stamp="$bin/.$name.version"
  wanted "$name" || return 0
  if [[ -x "$bin/$name" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    return
  fi
  local start=$SECONDS
  echo "Building $name $version"
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags=-s -o "$bin/$name" "$pkg")
  echo "$version" >"$stamp"
  echo "Built $name in $((SECONDS - start)) s"
}

kube_version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$root/hack/tools/kube/go.mod")
etcd_version=$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$root/hack/tools/etcd/go.mod")

build etcd "$etcd_version" "$root/hack/tools/etcd" go.etcd.io/etcd/server/v3
build kube-apiserver "$kube_version" "$root/hack/tools/kube" k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager "$kube_version" "$root/hack/tools/kube" k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl "$kube_version" "$root/hack/tools/kube" k8s.io/kubernetes/cmd/kubectl
# The Cluster API in-cluster IPAM provider, run as a process by the tests that need a CAPI pool.
incluster_version=$(awk '$1=="require" && $2=="sigs.k8s.io/cluster-api-ipam-provider-in-cluster" {print $3}' "$root/hack/tools/incluster/go.mod")
build cluster-api-ipam-provider-in-cluster "$incluster_version" "$root/hack/tools/incluster" sigs.k8s.io/cluster-api-ipam-provider-in-cluster

# Tools whose modules carry no replace directives install straight from the proxy.
install() {
  local name=$1 pkg=$2 version=$3
  local stamp="$bin/.$name.version"
  wanted "$name" || return 0
  if [[ -x "$bin/$name" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    return
  fi
  local start=$SECONDS
  echo "Building $name $version"
  GOBIN="$bin" CGO_ENABLED=0 go install "$pkg@$version"
  echo "$version" >"$stamp"
  echo "Built $name in $((SECONDS - start)) s"
}
install controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen "${CONTROLLER_GEN_VERSION:-v0.20.1}"
install kustomize sigs.k8s.io/kustomize/kustomize/v5 "${KUSTOMIZE_VERSION:-v5.8.1}"
install golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint "${GOLANGCI_LINT_VERSION:-v2.15.0}"


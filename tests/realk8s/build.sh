#!/usr/bin/env bash
# Builds the real Kubernetes components the k8s tier runs, from their published Go modules
# (pinned in tests/realk8s/go/*/go.mod), into a cache outside the repository:
#   kube-apiserver kube-controller-manager kube-scheduler kubectl (k8s.io/kubernetes)
#   etcd (go.etcd.io/etcd/server/v3)   helm (helm.sh/helm/v3)
# A binary already in the cache is not rebuilt. Prints the cache's bin directory on the last line.
# Env: REALK8S_BIN (where the binaries go), GOFLAGS (default -p=2 on top of the machine's).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_VERSION="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$HERE/go/kubernetes/go.mod")"
BIN="${REALK8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-router/k8s-${K8S_VERSION}/bin}"
mkdir -p "$BIN"

command -v go >/dev/null || { echo "build.sh: the Go toolchain (go) is not on PATH; it builds the k8s tier's components" >&2; exit 2; }
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-p=2 -trimpath -buildvcs=false"
export CGO_ENABLED=0

# The release version, stamped as Kubernetes' own build does (hack/lib/version.sh): kubectl and helm read it
# from the API server (the chart's kubeVersion constraint is checked against it).
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
K8S_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

# build MODULE_DIR BINARY PACKAGE: `go build` one command unless the cache already has it.
build() {
    local dir="$1" name="$2" pkg="$3" ldflags="-s -w"
    [[ "$dir" == kubernetes ]] && ldflags+="$K8S_LDFLAGS"
    if [[ -x "$BIN/$name" ]]; then
        echo "build.sh: $name already built ($BIN/$name)" >&2
        return
    fi
    local start=$SECONDS
    echo "build.sh: building $name from $pkg ..." >&2
    (cd "$HERE/go/$dir" && go build -ldflags="$ldflags" -o "$BIN/$name.tmp" "$pkg")
    mv "$BIN/$name.tmp" "$BIN/$name"
    echo "build.sh: built $name in $((SECONDS - start)) s" >&2
}

start=$SECONDS
build etcd etcd go.etcd.io/etcd/server/v3
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kubernetes kubectl k8s.io/kubernetes/cmd/kubectl
build helm helm helm.sh/helm/v3/cmd/helm
echo "build.sh: Kubernetes ${K8S_VERSION} components ready in $((SECONDS - start)) s" >&2
echo "$BIN"

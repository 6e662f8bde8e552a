#!/usr/bin/env bash
# Builds the cluster's binaries from their published Go modules into $CODERUN_CACHE/bin/<name>-<version>/.
# A finished build is never redone; a cold machine needs ~15 min of its 2 cores, a warm one a few ms.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.sh"
export GOFLAGS='-mod=mod -buildvcs=false' CGO_ENABLED=0 GOTOOLCHAIN=local

# build_into NAME VERSION SCRIPT: runs SCRIPT (bash, with $out set) once, then marks the result complete.
build_into() {
  local name=$1 version=$2 script=$3 dir="$CODERUN_CACHE/bin/$1-$2"
  [ -f "$dir/.complete" ] && return 0
  echo "building $name $version (cached afterwards in $dir)"
  local start=$SECONDS
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  out="$dir.tmp" bash -euo pipefail -c "$script"
  rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.complete"
  echo "built $name in $((SECONDS - start)) s"
}

# A throwaway main module that requires MODULE@VERSION (with REPLACES lines), for `go build PKG`.
make_build_module() {
  local dir=$1 require=$2 replaces=${3:-}
  mkdir -p "$dir" && cd "$dir"
  printf 'module coderun.local/build\n\ngo 1.26\n\nrequire %s\n%s\n' "$require" "$replaces" > go.mod
}
export -f make_build_module

k8s_script=$(cat <<'SCRIPT'
src="$CODERUN_CACHE/src/kubernetes-$KUBERNETES_VERSION"
minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
staging_version="v0.${KUBERNETES_VERSION#v1.}"
# k8s.io/kubernetes replaces its staging modules with local paths; pin each to its published release instead.
mkdir -p "$src" && cd "$src"
curl -fsS --retry 3 "https://proxy.golang.org/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.mod" -o kubernetes.mod
replaces=$(printf 'replace (\n%s\n)' "$(grep '=> ./staging' kubernetes.mod | awk -v v="$staging_version" '{print "\t"$1" => "$1" "v}')")
make_build_module "$src" "k8s.io/kubernetes $KUBERNETES_VERSION" "$replaces"
printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' > tools.go
go mod tidy >/dev/null 2>&1 || go mod download
ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1"
ld="$ld -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
ld="$ld -X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  go build -ldflags "$ld" -o "$out/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done
SCRIPT
)

etcd_script=$(cat <<'SCRIPT'
make_build_module "$CODERUN_CACHE/src/etcd-$ETCD_VERSION" "go.etcd.io/etcd/server/v3 $ETCD_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
go mod tidy >/dev/null
go build -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
SCRIPT
)

# containerd 2: gVisor's current shim speaks the containerd 2 shim protocol, which Debian's containerd 1.6 cannot.
containerd_script=$(cat <<'SCRIPT'
make_build_module "$CODERUN_CACHE/src/containerd-$CONTAINERD_VERSION" "github.com/containerd/containerd/v2 $CONTAINERD_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/containerd/containerd/v2/cmd/containerd"\n' > tools.go
go mod tidy >/dev/null
for cmd in containerd containerd-shim-runc-v2 ctr; do
  go build -tags no_btrfs -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    -o "$out/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd"
done
SCRIPT
)

# gVisor's `go` branch is a complete main module (generated code included): build it in place.
gvisor_script=$(cat <<'SCRIPT'
src="$CODERUN_CACHE/src/gvisor-$GVISOR_VERSION$GVISOR_PATCH"
if [ ! -f "$src/go.mod" ]; then
  moddir=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$src" && cp -r "$moddir" "$src" && chmod -R u+w "$src"
fi
cd "$src"
# The shim fails its start when it cannot raise its own oom_score_adj, which this machine refuses (no
# CAP_SYS_RESOURCE). The score only ranks the shim for the OOM killer, so go on without it (silently:
# whatever `start` prints on stdout is read by containerd as the shim's address).
sed -i 's|return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)|_ = err // OOM score refused here; not fatal|' pkg/shim/v1/manager.go
grep -q 'OOM score refused here; not fatal' pkg/shim/v1/manager.go
# The audit (docs/audit.md): proto3 strings must be valid UTF-8, and the remote sink dropped a point whose path,
# argv or cwd was not, without counting it: a program could hide an open or an exec behind a name with an invalid
# byte. Such strings are made valid (U+FFFD for each bad byte) and the point sent; one that still does not marshal
# is counted as dropped.
cat > pkg/sentry/seccheck/sinks/remote/coderun_utf8.go <<'GO'
package remote

import (
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// makeValid rewrites every string of m (nested messages and lists included) as valid UTF-8.
func makeValid(m protoreflect.Message) {
	type set struct {
		fd protoreflect.FieldDescriptor
		v  protoreflect.Value
	}
	var sets []set
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		message := fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind
		switch {
		case fd.IsMap():
		case fd.IsList():
			for i, l := 0, v.List(); i < l.Len(); i++ {
				if fd.Kind() == protoreflect.StringKind {
					l.Set(i, protoreflect.ValueOfString(validUTF8(l.Get(i).String())))
				} else if message {
					makeValid(l.Get(i).Message())
				}
			}
		case fd.Kind() == protoreflect.StringKind:
			sets = append(sets, set{fd, protoreflect.ValueOfString(validUTF8(v.String()))})
		case message:
			makeValid(v.Message())
		}
		return true
	})
	for _, s := range sets {
		m.Set(s.fd, s.v)
	}
}

func marshalValid(msg proto.Message) ([]byte, error) {
	out, err := proto.Marshal(msg)
	if err == nil {
		return out, nil
	}
	makeValid(msg.ProtoReflect())
	return proto.Marshal(msg)
}
GO
sed -i 's|out, err := proto.Marshal(msg)|out, err := marshalValid(msg) // coderun: invalid UTF-8 made valid|; s|log.Debugf("Marshal(%+v): %v", msg, err)|log.Debugf("Marshal(%+v): %v", msg, err); r.droppedCount.Add(1) // coderun: counted|' \
  pkg/sentry/seccheck/sinks/remote/remote.go
grep -q 'coderun: invalid UTF-8 made valid' pkg/sentry/seccheck/sinks/remote/remote.go
grep -q 'r.droppedCount.Add(1) // coderun: counted' pkg/sentry/seccheck/sinks/remote/remote.go
go build -ldflags "-s -w" -o "$out/runsc" ./runsc
go build -ldflags "-s -w" -o "$out/containerd-shim-runsc-v1" ./shim
SCRIPT
)

# helm's release ldflags (its Makefile) set internal/version; metadata stays empty for a tagged build.
helm_script=$(cat <<'SCRIPT'
make_build_module "$CODERUN_CACHE/src/helm-$HELM_VERSION" "helm.sh/helm/v4 $HELM_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "helm.sh/helm/v4/cmd/helm"\n' > tools.go
go mod tidy >/dev/null
go build -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  -o "$out/helm" helm.sh/helm/v4/cmd/helm
SCRIPT
)

# CoreDNS with the plugins its own build compiles in (core/plugin/zplugin.go): the main package of its module.
coredns_script=$(cat <<'SCRIPT'
make_build_module "$CODERUN_CACHE/src/coredns-$COREDNS_VERSION" "github.com/coredns/coredns $COREDNS_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/coredns/coredns"\n' > tools.go
go mod tidy >/dev/null
go build -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$out/coredns" \
  github.com/coredns/coredns
SCRIPT
)

# Versity's S3 gateway, the chart's embedded store (e2e/images/recipes/store.sh puts it in an image).
versitygw_script=$(cat <<'SCRIPT'
make_build_module "$CODERUN_CACHE/src/versitygw-$VERSITYGW_VERSION" "github.com/versity/versitygw $VERSITYGW_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/versity/versitygw/cmd/versitygw"\n' > tools.go
go mod tidy >/dev/null
go build -ldflags "-s -w -X main.Version=$VERSITYGW_VERSION" -o "$out/versitygw" github.com/versity/versitygw/cmd/versitygw
SCRIPT
)

export KUBERNETES_VERSION ETCD_VERSION CONTAINERD_VERSION GVISOR_VERSION GVISOR_PATCH HELM_VERSION COREDNS_VERSION \
  VERSITYGW_VERSION CODERUN_CACHE
components=("$@")
[ $# -gt 0 ] || components=(etcd containerd gvisor kubernetes helm coredns versitygw)
for component in "${components[@]}"; do
  case $component in
    etcd) build_into etcd "$ETCD_VERSION" "$etcd_script" ;;
    containerd) build_into containerd "$CONTAINERD_VERSION" "$containerd_script" ;;
    gvisor) build_into gvisor "$GVISOR_VERSION$GVISOR_PATCH" "$gvisor_script" ;;
    kubernetes) build_into kubernetes "$KUBERNETES_VERSION" "$k8s_script" ;;
    helm) build_into helm "$HELM_VERSION" "$helm_script" ;;
    coredns) build_into coredns "$COREDNS_VERSION" "$coredns_script" ;;
    versitygw) build_into versitygw "$VERSITYGW_VERSION" "$versitygw_script" ;;
    *) echo "unknown component $component" >&2; exit 2 ;;
  esac
done

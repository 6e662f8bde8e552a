# Pinned versions of everything the local cluster builds. The cache key of every build is its version.
KUBERNETES_NEWEST=v1.36.2         # last minor whose kubelet runs on cgroup v1 with containerd 1.6's CRI
KUBERNETES_OLDEST=v1.31.4         # the oldest the chart supports (Chart.yaml kubeVersion): `make test-oldest`; the newest 1.31 patch whose modules the proxy here serves in full
# The cluster's version: the newest unless the caller names another (KUBERNETES_VERSION=$KUBERNETES_OLDEST).
KUBERNETES_VERSION=${KUBERNETES_VERSION:-$KUBERNETES_NEWEST}
ETCD_VERSION=v3.6.16              # etcd 3.4 (Debian) lacks RequestWatchProgress, which apiserver 1.36 needs
CONTAINERD_VERSION=v2.1.5         # the containerd gVisor's shim is built against (Debian's 1.6 cannot start it)
GVISOR_VERSION=v0.0.0-20260905035102-160fafc42237   # a commit of gVisor's `go` branch
GVISOR_PATCH=-p3                  # bumped whenever build-binaries.sh patches gVisor differently
HELM_VERSION=v4.3.1               # latest helm.sh/helm/v4 release on the Go module proxy
COREDNS_VERSION=v1.15.0           # the cluster's DNS: latest github.com/coredns/coredns on the Go module proxy
VERSITYGW_VERSION=v1.8.0          # the embedded S3 store (chart's store.embedded): github.com/versity/versitygw
CODERUN_CACHE=${CODERUN_CACHE:-$HOME/.cache/coderun}

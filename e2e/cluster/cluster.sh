#!/usr/bin/env bash
# A real single-node Kubernetes cluster as host processes, like Kubernetes' own local-up-cluster.sh:
# etcd, kube-apiserver, CoreDNS (the cluster DNS), kube-controller-manager, kube-scheduler, containerd (runc +
# gVisor), kubelet, kube-proxy and a NetworkPolicy enforcer, and stand-ins for the internet and a metadata service
# on the node's loopback (standins.py). State, logs and pid files live under .cluster/ in the repo.
#   cluster.sh up | down | status | verify-down
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/versions.sh"

CLUSTER_DIR=${CLUSTER_DIR:-$repo/.cluster}
PKI=$CLUSTER_DIR/pki
LOGS=$CLUSTER_DIR/logs
PIDS=$CLUSTER_DIR/pids
KUBECONFIG_ADMIN=$CLUSTER_DIR/kubeconfig
K8S_BIN=$CODERUN_CACHE/bin/kubernetes-$KUBERNETES_VERSION
ETCD_BIN=$CODERUN_CACHE/bin/etcd-$ETCD_VERSION
CONTAINERD_BIN=$CODERUN_CACHE/bin/containerd-$CONTAINERD_VERSION
GVISOR_BIN=$CODERUN_CACHE/bin/gvisor-$GVISOR_VERSION$GVISOR_PATCH
COREDNS_BIN=$CODERUN_CACHE/bin/coredns-$COREDNS_VERSION
CONTAINERD_SOCK=$CLUSTER_DIR/containerd/containerd.sock
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10  # the kube-dns Service, in front of CoreDNS on the node's address
CLUSTER_DOMAIN=cluster.local
API_PORT=6443
POD_BRIDGE=cni-coderun0
AUDIT_DIR=/run/coderun/audit  # the audit agent's socket and the trace session (the chart's hostPath)
L2_TABLE=coderun-l2
STANDIN_HITS=$CLUSTER_DIR/standin-hits.jsonl  # e2e/conftest.py's standin_hits fixture reads it
NODE_NAME=$(hostname)
# Components in start order; `down` stops them in reverse.
COMPONENTS=(standins etcd kube-apiserver coredns containerd kube-controller-manager kube-scheduler kubelet kube-proxy netpol)

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# The node's address: the first global IPv4 address of the device its default route leaves by.
node_ip() {
  local dev; dev=$(ip -4 route show default | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -1)
  [ -n "$dev" ] && ip -4 -o addr show dev "$dev" scope global | awk '{ sub("/.*", "", $4); print $4; exit }'
}

is_running() { local f=$PIDS/$1.pid; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }

# start NAME CMD...: runs CMD in the background with its log and pid file, unless it already runs.
start() {
  local name=$1; shift
  if is_running "$name"; then return 0; fi
  mkdir -p "$LOGS" "$PIDS"
  # Without the caller's other open files: a daemon that inherited a `flock` lock file would hold the lock for
  # as long as it lives, and every later `flock ... make up` would wait forever.
  ( for fd in /proc/self/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done 2>/dev/null
    exec setsid "$@" >>"$LOGS/$name.log" 2>&1 < /dev/null ) &
  echo $! > "$PIDS/$name.pid"
}

# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds; names the log to read when it does not.
wait_for() {
  local what=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$what not ready after ${seconds}s; see $LOGS/"
    sleep 0.2
  done
}

stop() {
  local name=$1 f=$PIDS/$1.pid
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    # kube-apiserver has been seen to ignore SIGTERM here: a grace period, then SIGKILL.
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# ---------------------------------------------------------------- certificates and kubeconfigs
make_cert() { # NAME CN ORG [SANS]
  local name=$1 cn=$2 org=$3 sans=${4:-}
  [ -f "$PKI/$name.crt" ] && return 0
  local ext="$PKI/$name.ext"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' > "$ext"
  [ -n "$sans" ] && echo "subjectAltName=$sans" >> "$ext"
  local subj="/CN=$cn"; [ -n "$org" ] && subj="/O=$org$subj"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 3650 \
    -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
}

make_kubeconfig() { # FILE CERTNAME
  local file=$1 cert=$2
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: coderun-local
  cluster: {certificate-authority: $PKI/ca.crt, server: "https://127.0.0.1:$API_PORT"}
users:
- name: $cert
  user: {client-certificate: $PKI/$cert.crt, client-key: $PKI/$cert.key}
contexts:
- name: coderun-local
  context: {cluster: coderun-local, user: $cert}
current-context: coderun-local
EOF
}

setup_pki() {
  mkdir -p "$PKI"
  local ip=$1
  if [ ! -f "$PKI/ca.crt" ]; then
    openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -days 3650 -subj "/CN=coderun-local-ca" \
      -out "$PKI/ca.crt" 2>/dev/null
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
  make_cert apiserver kube-apiserver "" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE_NAME,IP:127.0.0.1,IP:$API_SERVICE_IP,IP:$ip"
  make_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  make_cert admin kubernetes-admin system:masters
  make_cert controller-manager system:kube-controller-manager ""
  make_cert scheduler system:kube-scheduler ""
  make_cert kube-proxy system:kube-proxy ""
  make_cert coredns system:coredns ""
  make_cert kubelet "system:node:$NODE_NAME" system:nodes "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$ip"
  make_kubeconfig "$KUBECONFIG_ADMIN" admin
  for c in controller-manager scheduler kube-proxy kubelet coredns; do make_kubeconfig "$CLUSTER_DIR/$c.kubeconfig" "$c"; done
}

# ---------------------------------------------------------------- host and containerd configuration
# gVisor's platform: systrap (fast, no ptrace stops) where it runs, else ptrace. GVISOR_PLATFORM overrides.
pick_gvisor_platform() {
  local p
  for p in ${GVISOR_PLATFORM:-systrap ptrace}; do
    if timeout 60 "$GVISOR_BIN/runsc" --platform="$p" --network=none --root="$CLUSTER_DIR/runsc-probe" \
        do /bin/true >/dev/null 2>&1; then echo "$p"; return 0; fi
    log "gVisor's $p platform does not run here"
  done
  die "gVisor runs on none of: ${GVISOR_PLATFORM:-systrap ptrace}"
}

# The pod network is IPv4 only, and IPv6 must not be a way around NetworkPolicy (a sandbox once reached the
# API server, the kubelet and a deny-all pod over link-local addresses). Three layers below the enforcer's
# own (netpol.py drops IPv6 from or to pod addresses it does not know, i.e. all of it here):
#  - the bridge exists before the first pod, with IPv6 disabled: the node has no address on it and drops
#    IPv6 arriving on it;
#  - an nftables bridge table lets only IPv4 and ARP frames in or out of a bridge port (pod veths), so no
#    IPv6 (nor anything else: VLAN-tagged, PPPoE, ...) passes between pods or to and from the node. This
#    kernel lacks NFT_BRIDGE_META (`meta ibrname`), so ports are matched by the bridge plugin's veth names;
#    the pod bridge is the only bridge the harness expects on the machine;
#  - the CNI chain's tuning plugin disables IPv6 on the pod's interface (see the conflist).
setup_ipv4_only_pod_network() {
  ip link show "$POD_BRIDGE" >/dev/null 2>&1 || ip link add "$POD_BRIDGE" type bridge
  echo 1 > "/proc/sys/net/ipv6/conf/$POD_BRIDGE/disable_ipv6"
  ip link set "$POD_BRIDGE" up
  # Declaring then deleting the table in one transaction replaces it atomically (idempotent `up`).
  nft -f - <<EOF
table bridge $L2_TABLE
delete table bridge $L2_TABLE
table bridge $L2_TABLE {
  chain forward {
    type filter hook forward priority -200; policy accept;
    iifname "veth*" ether type != { ip, arp } counter drop comment "pod port to pod port: IPv4 and ARP only"
  }
  chain input {
    type filter hook input priority -200; policy accept;
    iifname "veth*" ether type != { ip, arp } counter drop comment "pod port to the node: IPv4 and ARP only"
  }
  chain output {
    type filter hook output priority -200; policy accept;
    oifname "veth*" ether type != { ip, arp } counter drop comment "node to a pod port: IPv4 and ARP only"
  }
}
EOF
}

setup_host() {
  local platform; platform=$(pick_gvisor_platform)
  echo "$platform" > "$CLUSTER_DIR/gvisor-platform"
  # Pod traffic crosses a Linux bridge: make bridged packets, IPv4 and IPv6, visible to iptables/nftables
  # (kube-proxy, netpol: its inet table then polices pod-to-pod IPv6 on the bridge too).
  echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
  echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables
  echo 1 > /proc/sys/net/ipv4/ip_forward
  setup_ipv4_only_pod_network
  mkdir -p "$CLUSTER_DIR/cni/net.d"
  # tuning: no IPv6 on the pod's interface (CNI_IFNAME is eth0 under containerd's CRI), so neither runc nor
  # gVisor (which copies the netns' addresses at start) gives a pod a link-local address to use.
  # No ipMasq and no portmap: pods reach only the node and each other, which needs no NAT and no host ports,
  # and each of those plugins lists and edits the nat table on every pod's start and end, serialised on the
  # xtables lock: with a batch of sandboxes and a warm pool's refill starting at once, a pod's network took up to
  # 16 s (containerd's RunPodSandbox).
  cat > "$CLUSTER_DIR/cni/net.d/10-coderun.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "coderun", "plugins": [
  {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$CLUSTER_DIR/cni/ipam"}},
  {"type": "tuning", "sysctl": {"net.ipv6.conf.eth0.disable_ipv6": "1"}},
  {"type": "loopback"}]}
EOF
  # The audit's trace session (docs/audit.md): every sandbox's runsc connects to the audit agent's socket in
  # this directory (the chart's DaemonSet mounts it). The session is written before any sandbox starts (the
  # agent writes the same file when it starts); a sandbox started while no agent listens runs untraced.
  mkdir -p "$AUDIT_DIR"
  PYTHONPATH="$repo/src" python3 -c 'import json, sys; from coderun.audit.trace_config import pod_init_config
json.dump(pod_init_config(sys.argv[1] + "/sink.sock"), sys.stdout)' "$AUDIT_DIR" > "$AUDIT_DIR/pod-init.json.tmp"
  mv "$AUDIT_DIR/pod-init.json.tmp" "$AUDIT_DIR/pod-init.json"
  cat > "$CLUSTER_DIR/runsc.toml" <<EOF
binary_name = "$GVISOR_BIN/runsc"
root = "/run/coderun/runsc"
[runsc_config]
  platform = "$platform"
  debug-log = "$LOGS/runsc/"
  debug = "false"
  pod-init-config = "$AUDIT_DIR/pod-init.json"
EOF
  # The same runsc without the trace session: the RuntimeClass gvisor-untraced, for the audit's cost benchmark.
  grep -v '^  pod-init-config = ' "$CLUSTER_DIR/runsc.toml" > "$CLUSTER_DIR/runsc-untraced.toml"
  mkdir -p "$LOGS/runsc"
  cat > "$CLUSTER_DIR/containerd.toml" <<EOF
version = 2
root = "$CLUSTER_DIR/containerd/root"
state = "$CLUSTER_DIR/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "coderun.local/pause:3.10"
  # This machine lacks CAP_SYS_RESOURCE: without it runc fails writing oom_score_adj.
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$CLUSTER_DIR/runsc.toml"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc-untraced]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc-untraced.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$CLUSTER_DIR/runsc-untraced.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CLUSTER_DIR/cni/net.d"
EOF
  cat > "$CLUSTER_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
serializeImagePulls: false
# Images are imported, never pulled: garbage-collecting them would break the next run.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}
localStorageCapacityIsolation: true
containerLogMaxSize: 10Mi
maxPods: 110
resolvConf: /etc/resolv.conf
# Pods with dnsPolicy ClusterFirst (the egress proxy) ask CoreDNS through the kube-dns Service; sandboxes have no
# resolver at all (dnsPolicy None).
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: $CLUSTER_DOMAIN
# PIDs (cgroup v1 pids controller, cgroupfs driver: kubelet writes pids.max of each pod's cgroup, and of
# kubepods from the reservation below). A gVisor pod's Sentry and Gofer live in the pod's cgroup: measured
# here, an idle gVisor pod holds ~45 host tasks and each sandboxed process ~2 more under systrap (50 -> 140,
# 200 -> 440, 400 -> 840 tasks), so 1024 leaves a program ~490 processes, far above real workloads and far
# below this machine's kernel.pid_max of 32768. Measured: a fork bomb stops at exactly 1024 tasks and its
# gVisor sandbox then exits (the pod fails, exit code 128); the node and other pods are untouched.
podPidsLimit: 1024
# Keep PIDs for the node's own processes (kubelet, containerd, shims, apiserver): kubepods.pids.max becomes
# capacity minus this, so even many pods at their limit cannot exhaust the node's PID space.
systemReserved: {pid: "4096"}
EOF
}

# ---------------------------------------------------------------- components
start_etcd() {
  start etcd "$ETCD_BIN/etcd" --name coderun --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster coderun=http://127.0.0.1:2380 --quota-backend-bytes 4294967296 \
    --unsafe-no-fsync=true
  wait_for etcd 30 curl -fsS http://127.0.0.1:2379/health
}

start_apiserver() {
  local ip=$1
  start kube-apiserver "$K8S_BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
    --bind-address 0.0.0.0 --secure-port $API_PORT --advertise-address "$ip" \
    --service-cluster-ip-range $SERVICE_CIDR --allow-privileged=true \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction,PodSecurity \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" --kubelet-certificate-authority "$PKI/ca.crt" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --api-audiences https://kubernetes.default.svc.cluster.local --profiling=false
  wait_for kube-apiserver 90 kubectl get --raw /readyz
}

start_containerd() {
  # /run/netns becomes a shared mount point of its own before any pod's netns is mounted under it, as `ip netns`
  # makes it the first time it runs: made later (e2e/test_network.py's test hosts), it would hide the pods'
  # netns mounts made before it, and those pods could never be deleted ("unlinkat ...: device or resource busy").
  mkdir -p /run/netns
  mountpoint -q /run/netns || mount --bind /run/netns /run/netns
  mount --make-shared /run/netns
  PATH="$CONTAINERD_BIN:$GVISOR_BIN:$PATH" start containerd "$CONTAINERD_BIN/containerd" --config "$CLUSTER_DIR/containerd.toml"
  wait_for containerd 30 "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" version
}

# The stand-ins (standins.py): their addresses on lo, a listener on each, every hit a line in STANDIN_HITS.
start_standins() {
  start standins python3 "$here/standins.py" serve "$STANDIN_HITS"
  wait_for standins 30 python3 "$here/standins.py" ready
}

# CoreDNS answers the cluster's names (Services, ExternalName aliases) and the stand-ins' zone (standins.py), and
# NXDOMAIN for every other name: it forwards nothing, so no lookup a test makes leaves the machine.
# It runs on the host like the other components, on the node's address only: pods reach it through the kube-dns
# Service (apply_cluster_objects), and a sandbox's NetworkPolicy keeps it from there as from any other address.
start_coredns() {
  local ip=$1
  python3 "$here/standins.py" zone > "$CLUSTER_DIR/standins.zone"
  cat > "$CLUSTER_DIR/Corefile" <<EOF
$CLUSTER_DOMAIN:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $ip
    errors
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $CLUSTER_DIR/coredns.kubeconfig coderun-local
        ttl 5
    }
    cache 5
}
$(python3 "$here/standins.py" zone-name):53 {
    bind $ip
    errors
    file $CLUSTER_DIR/standins.zone
}
.:53 {
    bind $ip
    errors
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOF
  start coredns "$COREDNS_BIN/coredns" -conf "$CLUSTER_DIR/Corefile"
  wait_for coredns 30 bash -c "exec 3<>/dev/tcp/$ip/53"
}

start_controllers() {
  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --use-service-account-credentials --controllers '*' --leader-elect=false --bind-address 127.0.0.1
  start kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" --leader-elect=false --bind-address 127.0.0.1
}

start_kubelet() {
  local ip=$1
  mkdir -p "$CLUSTER_DIR/kubelet"
  start kubelet "$K8S_BIN/kubelet" --config "$CLUSTER_DIR/kubelet.yaml" \
    --kubeconfig "$CLUSTER_DIR/kubelet.kubeconfig" --root-dir "$CLUSTER_DIR/kubelet" \
    --hostname-override "$NODE_NAME" --node-ip "$ip"
  start kube-proxy "$K8S_BIN/kube-proxy" --kubeconfig "$CLUSTER_DIR/kube-proxy.kubeconfig" \
    --hostname-override "$NODE_NAME" --cluster-cidr $POD_CIDR --proxy-mode iptables \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
    --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
}

start_netpol() {
  start netpol "$repo/.venv/bin/python" "$here/netpol.py" --kubeconfig "$KUBECONFIG_ADMIN" --node "$NODE_NAME" \
    --pod-cidr "$POD_CIDR" --bridge "$POD_BRIDGE"
}

apply_cluster_objects() {
  local ip=$1
  kubectl apply -f - >/dev/null <<EOF
# CoreDNS's read access (the kubernetes plugin lists and watches these), as kubeadm grants it.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [services, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: User, name: "system:coredns", apiGroup: rbac.authorization.k8s.io}]
---
# The cluster DNS address every ClusterFirst pod is given (the kubelet's clusterDNS), backed by CoreDNS on the
# node: a Service without a selector and the EndpointSlice written here.
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: $DNS_SERVICE_IP
  ports:
    - {name: dns, port: 53, targetPort: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, targetPort: 53, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-node
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: coderun-local}
addressType: IPv4
endpoints:
  - addresses: [$ip]
    conditions: {ready: true}
ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
# The gVisor sandbox (Sentry, Gofer) runs inside the pod's own cgroup: its cost is declared here,
# so that a run's limits stay the run's.
overhead:
  podFixed: {memory: 64Mi, cpu: 50m}
---
# gVisor without the audit's trace session (e2e/bench/audit.py compares the two).
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor-untraced}
handler: runsc-untraced
overhead:
  podFixed: {memory: 64Mi, cpu: 50m}
EOF
}

# Ready only counts once this kubelet answers: after a restart the node object still says Ready from before.
node_ready() { curl -fsS http://127.0.0.1:10248/healthz >/dev/null && kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -q True; }

# "ref digest" of each coderun.local image by tag in the node's containerd.
coderun_images() {
  "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images ls |
    awk '$1 ~ /^coderun\.local\/[^@]*:[^@:]*$/ {print $1, $3}'
}

# Builds (cached) and imports the images; an archive already imported into this containerd is skipped.
import_images() {
  local name archive imported=$CLUSTER_DIR/containerd/imported
  touch "$imported"
  for name in pause busybox python node operator egress-proxy store; do
    archive=$("$repo/e2e/images/build.sh" "$name" | tail -1)
    grep -qxF "$archive" "$imported" && continue
    "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images import "$archive" >/dev/null
    echo "$archive" >> "$imported"
  done
  # Also name each image by its digest (repo@sha256:...), as a registry pull would: the kubelet then lists the
  # digest in the node's status.images, and the operator's result cache keys on what a tag means now.
  coderun_images | while read -r ref digest; do
      "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images tag --force "$ref" "${ref%:*}@$digest" \
        >/dev/null
    done
}

cmd_up() {
  local start_time=$SECONDS ip
  [ "$(id -u)" = 0 ] || die "the local cluster runs host processes as root; run as root"
  "$here/install-packages.sh"
  "$here/build-binaries.sh"
  ip=$(node_ip); [ -n "$ip" ] || die "no non-loopback IPv4 address for the node"
  mkdir -p "$CLUSTER_DIR" "$LOGS" "$PIDS"
  # A cluster of another Kubernetes version (the oldest supported, for `make test-oldest`, or back) starts from
  # an empty etcd and kubelet: an API server must not read what a newer one wrote.
  local ran; ran=$(cat "$CLUSTER_DIR/kubernetes-version" 2>/dev/null || echo "$KUBERNETES_VERSION")
  if [ "$ran" != "$KUBERNETES_VERSION" ]; then
    is_running kube-apiserver && die "a cluster of Kubernetes $ran runs here: make down first"
    grep -q " $CLUSTER_DIR/kubelet" /proc/mounts && die "mounts left under $CLUSTER_DIR/kubelet: make down first"
    log "the last cluster here ran Kubernetes $ran: $KUBERNETES_VERSION starts from an empty etcd"
    rm -rf "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/kubelet"
  fi
  echo "$KUBERNETES_VERSION" > "$CLUSTER_DIR/kubernetes-version"
  setup_pki "$ip"
  setup_host
  start_standins
  start_etcd
  start_apiserver "$ip"
  start_coredns "$ip"
  start_containerd
  import_images
  start_controllers
  start_kubelet "$ip"
  apply_cluster_objects "$ip"
  start_netpol
  wait_for "node $NODE_NAME Ready" 120 node_ready
  log "cluster up in $((SECONDS - start_time)) s: kubectl --kubeconfig $KUBECONFIG_ADMIN get nodes"
  log "kubectl $KUBERNETES_VERSION is $K8S_BIN/kubectl; logs in $LOGS; gVisor platform $(cat "$CLUSTER_DIR/gvisor-platform")"
}

cmd_down() {
  local i
  # Pods first, while the kubelet can still tear down their sandboxes and mounts cleanly.
  if is_running kubelet && is_running kube-apiserver; then
    kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    { "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io tasks ls -q 2>/dev/null || true; } | while read -r t; do
      "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
  fi
  for ((i=${#COMPONENTS[@]}-1; i>=0; i--)); do stop "${COMPONENTS[$i]}"; done
  # Shims and sandboxes are started by containerd but outlive it: end those whose socket or state is ours.
  pkill -KILL -f "containerd-shim-.* -address $CONTAINERD_SOCK" 2>/dev/null || true
  pkill -KILL -f "runsc.*--root=/run/coderun/runsc" 2>/dev/null || true
  # A Deployment's pods (the chart's operator) are recreated between the pod deletion above and the kubelet's
  # stop, and runc containers outlive their shim: end whatever is still in the pod cgroups our kubelet made.
  find /sys/fs/cgroup/pids/kubepods* -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  # Mounts made for pods (emptyDir, configmap, rootfs overlays, netns) under our directory.
  { grep -o " $CLUSTER_DIR[^ ]*\| /run/coderun/runsc[^ ]*\| /run/netns/cni-[^ ]*" /proc/mounts || true; } | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -f /run/netns/cni-* 2>/dev/null || true
  ip link delete "$POD_BRIDGE" 2>/dev/null || true
  rm -rf "$CLUSTER_DIR/cni/ipam"
  nft delete table inet coderun-netpol 2>/dev/null || true
  nft delete table bridge "$L2_TABLE" 2>/dev/null || true
  python3 "$here/standins.py" remove
  log "cluster down"
}

# After `down`: nothing of the cluster may be left, no process started from its binaries or in a pod's
# cgroup, no mount under its directory, and no stand-in address on lo.
cmd_verify_down() {
  local left=0 procs
  procs=$(pgrep -af "$CODERUN_CACHE/bin/|--root=/run/coderun/runsc|$here/netpol.py|$here/standins.py|$repo/.venv/bin/coderun-operator" || true)
  [ -z "$procs" ] || { log "processes left: $procs"; left=1; }
  procs=$(find /sys/fs/cgroup/pids/kubepods* -name cgroup.procs -exec cat {} + 2>/dev/null || true)
  [ -z "$procs" ] || { log "processes left in pod cgroups: $(echo $procs)"; left=1; }
  if grep -q " $CLUSTER_DIR" /proc/mounts; then log "mounts left: $(grep " $CLUSTER_DIR" /proc/mounts)"; left=1; fi
  if nft list tables 2>/dev/null | grep -qE "coderun-netpol|$L2_TABLE"; then log "nftables tables left"; left=1; fi
  python3 "$here/standins.py" check || left=1
  [ $left = 0 ] && log "nothing of the cluster is left running or mounted"
  return $left
}

cmd_status() {
  local c
  for c in "${COMPONENTS[@]}"; do
    if is_running "$c"; then printf '%-24s running  pid %-8s log %s\n' "$c" "$(cat "$PIDS/$c.pid")" "$LOGS/$c.log"
    else printf '%-24s stopped\n' "$c"; fi
  done
  if is_running kube-apiserver; then kubectl get nodes -o wide 2>/dev/null || true; fi
  echo "stand-in addresses on lo: $(python3 "$here/standins.py" on-lo)"
  echo "kubeconfig: $KUBECONFIG_ADMIN   kubectl: $K8S_BIN/kubectl   gVisor platform: $(cat "$CLUSTER_DIR/gvisor-platform" 2>/dev/null)"
}

# Builds (cached) and imports the images into the running cluster; prints "ref digest" for each coderun image.
cmd_images() {
  import_images
  coderun_images
}

case ${1:-} in
  up) cmd_up ;;
  images) cmd_images ;;
  down) cmd_down ;;
  status) cmd_status ;;
  verify-down) cmd_verify_down ;;
  *) echo "usage: $0 up|down|status|verify-down|images" >&2; exit 2 ;;
esac

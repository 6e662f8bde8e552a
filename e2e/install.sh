#!/usr/bin/env bash
# Installs coderun on the local cluster the way users do: the operator image (built without a registry and
# imported into the node's containerd) and the Helm chart, two replicas, one leading.
#   install.sh install [helm args...]   helm upgrade --install, then wait for a leader
#   install.sh uninstall                helm uninstall (the CRDs and every CodeRun stay: crds.keep)
#   install.sh status
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/e2e/cluster/versions.sh"
export KUBECONFIG=${KUBECONFIG:-$repo/.cluster/kubeconfig}
HELM=$CODERUN_CACHE/bin/helm-$HELM_VERSION/helm
KUBECTL=$CODERUN_CACHE/bin/kubernetes-$KUBERNETES_VERSION/kubectl
RELEASE=${CODERUN_RELEASE:-coderun}
NAMESPACE=${CODERUN_NAMESPACE:-coderun-system}

# What helm's "not ready" leaves out: each of the release's pods that is not Ready, its conditions, its
# containers' states and the warnings about it, so that a CI log says why.
diagnose() {
  echo "install.sh: the release did not become ready; its pods and the cluster's warnings:" >&2
  "$KUBECTL" get pods -A -l "app.kubernetes.io/instance=$RELEASE" -o wide >&2 || true
  "$KUBECTL" get pods -A -l "app.kubernetes.io/instance=$RELEASE" -o json 2>/dev/null | python3 -c '
import json, sys
for pod in json.load(sys.stdin)["items"]:
    status = pod.get("status", {})
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])):
        continue
    print(pod["metadata"]["namespace"] + "/" + pod["metadata"]["name"], status.get("phase"))
    for condition in status.get("conditions", []):
        print("  condition", condition.get("type"), condition.get("status"), condition.get("message", ""))
    for container in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
        print("  container", container["name"], json.dumps(container.get("state")), "restarts",
              container.get("restartCount"))
' >&2 || true
  local namespace
  for namespace in $("$KUBECTL" get pods -A -l "app.kubernetes.io/instance=$RELEASE" \
      -o jsonpath='{range .items[*]}{.metadata.namespace}{"\n"}{end}' 2>/dev/null | sort -u); do
    "$KUBECTL" logs -n "$namespace" -l "app.kubernetes.io/instance=$RELEASE" --all-containers --prefix \
      --tail 10 >&2 || true
  done
  "$KUBECTL" get events -A --field-selector type=Warning --sort-by=.lastTimestamp 2>/dev/null | tail -25 >&2 || true
}

installed() { "$HELM" status "$RELEASE" -n "$NAMESPACE" >/dev/null 2>&1; }

install() {
  bash "$repo/e2e/cluster/build-binaries.sh" helm
  bash "$repo/e2e/operator.sh" stop  # one operator at a time: the host-process one would race the chart's
  local images digest proxy_digest store_digest
  images=$(bash "$repo/e2e/cluster/cluster.sh" images)
  digest=$(awk '$1 == "coderun.local/operator:v1" {print $2}' <<<"$images")
  proxy_digest=$(awk '$1 == "coderun.local/egress-proxy:v1" {print $2}' <<<"$images")
  store_digest=$(awk '$1 == "coderun.local/store:v1" {print $2}' <<<"$images")
  [ -n "$digest" ] && [ -n "$proxy_digest" ] && [ -n "$store_digest" ] || {
    echo "install.sh: no digest for coderun.local/operator:v1, coderun.local/egress-proxy:v1 or coderun.local/store:v1" >&2
    exit 1; }
  # The namespace the operator runs in is held to Pod Security `restricted`, which its pods meet.
  "$KUBECTL" create namespace "$NAMESPACE" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
  "$KUBECTL" label namespace "$NAMESPACE" --overwrite pod-security.kubernetes.io/enforce=restricted >/dev/null
  # What `make up-host` left: everything it applied from crds/ with kubectl (the CRDs, the identity, approval and
  # session admission policies) becomes the release's (Helm's adoption labels), and the host-process operator's
  # webhook registration (kopf's, pointing at this host) goes.
  local object
  for object in $("$KUBECTL" get -f "$repo/crds/" -o name --ignore-not-found); do
    "$KUBECTL" label "$object" --overwrite app.kubernetes.io/managed-by=Helm >/dev/null
    "$KUBECTL" annotate "$object" --overwrite meta.helm.sh/release-name="$RELEASE" \
      meta.helm.sh/release-namespace="$NAMESPACE" >/dev/null
  done
  "$KUBECTL" delete validatingwebhookconfiguration validate.coderun.io --ignore-not-found >/dev/null
  # The local cluster's ranges (cluster.sh): kept off the webhook port and refused as sandbox egress unless a
  # policy sets allowClusterEgress.
  local node_ip
  node_ip=$("$KUBECTL" get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
  # The egress proxy may also reach pods of namespaces labelled as egress destinations: the e2e tests' in-cluster
  # web server and package index (e2e/test_egress.py), whose names a policy's cidr rule then allows.
  local destinations='[{"to": [{"namespaceSelector": {"matchLabels": {"coderun.io/egress-destination": "true"}}}]}]'
  # The proxy, the store and the data service ask little CPU here: the tests' requests are few, and the 2-core
  # node's room is the sandboxes' (a pool beside a one-core cold run). The chart's defaults are for a cluster's traffic.
  # --force-conflicts: fields `kubectl apply` set (make up-host) are taken over by the release, not a conflict.
  # 300 s: the agent and the proxy are Ready only once the operator has created their key Secret and the kubelet
  # has synced it into the mounted volume; on a loaded 2-core machine CI saw that take past 180 s.
  "$HELM" upgrade --install "$RELEASE" "$repo/charts/coderun" -n "$NAMESPACE" --force-conflicts \
    --set image.digest="$digest" --set egressProxy.image.digest="$proxy_digest" \
    --set store.embedded.image.digest="$store_digest" \
    --set-json "egressProxy.extraEgress=$destinations" --set 'clusterNetwork.podCIDRs={10.88.0.0/16}' \
    --set egressProxy.resources.requests.cpu=20m --set egressProxy.adminResources.requests.cpu=5m \
    --set store.embedded.resources.requests.cpu=10m --set data.resources.requests.cpu=10m \
    --set 'clusterNetwork.serviceCIDRs={10.96.0.0/16}' --set "clusterNetwork.nodeCIDRs={$node_ip/32}" \
    --wait --timeout 300s "$@" >/dev/null || { diagnose; exit 1; }
  local leader
  for _ in $(seq 300); do  # the Lease's holder, once it has labelled its pod (what the webhook Service needs)
    leader=$("$KUBECTL" -n "$NAMESPACE" get lease coderun-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
    if [ -n "$leader" ] && [ "$("$KUBECTL" -n "$NAMESPACE" get pod "$leader" \
        -o jsonpath='{.metadata.labels.coderun\.io/leader}' 2>/dev/null)" = true ]; then
      echo "coderun installed in $NAMESPACE with helm; leader $leader (image $digest)"; return 0
    fi
    sleep 0.2
  done
  "$KUBECTL" -n "$NAMESPACE" logs -l "app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/component=operator" --tail 30 >&2 || true
  echo "install.sh: no replica became leader within 60 s" >&2; exit 1
}

case ${1:-} in
  install) shift; install "$@" ;;
  uninstall) if installed; then "$HELM" uninstall "$RELEASE" -n "$NAMESPACE" --wait >/dev/null; fi ;;
  status) installed && "$HELM" status "$RELEASE" -n "$NAMESPACE" || echo "coderun is not installed with helm" ;;
  *) echo "usage: $0 install [helm args]|uninstall|status" >&2; exit 2 ;;
esac

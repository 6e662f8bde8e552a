#!/usr/bin/env bash
# Applies examples/coderun.yaml, waits with `kubectl wait --for=condition=Finished` and prints the finished
# status; exits 0 when the run succeeded. With KUBECONFIG set (`make demo` sets the local cluster's):
#   bash examples/demo.sh kubectl [NAMESPACE]     # NAMESPACE (default coderun-demo) is created if missing
set -euo pipefail
kubectl=${1:?usage: demo.sh KUBECTL [NAMESPACE]}
here=$(cd "$(dirname "$0")" && pwd)
ns=${2:-coderun-demo}
k() { "$kubectl" --kubeconfig "${KUBECONFIG:?}" "$@"; }

k create namespace $ns --dry-run=client -o yaml | k apply -f - >/dev/null
k label namespace $ns pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null
k -n $ns delete coderun conversion-rate --ignore-not-found --wait=true >/dev/null
k -n $ns apply -f "$here/coderun.yaml"
echo "waiting for the run to finish..."
# Finished is True once the run ended, however it ended (docs/api.md, Waiting with kubectl).
k -n $ns wait --for=condition=Finished coderun/conversion-rate --timeout=120s >/dev/null ||
  { echo "no result after 120 s; see \`kubectl -n coderun-system logs -l coderun.io/leader=true\`" \
    "(or .cluster/logs/operator.log after make up-host)" >&2; exit 1; }
phase=$(k -n $ns get coderun conversion-rate -o jsonpath='{.status.phase}')
echo
k -n $ns get coderun conversion-rate
echo
k -n $ns get coderun conversion-rate -o jsonpath='phase:     {.status.phase} ({.status.reason}), exit code {.status.exitCode}
message:   {.status.message}
image:     {.status.image}
metrics:   {.status.metrics}
validated: {.status.validation}
--- stdout
{.status.stdout}--- stderr
{.status.stderr}'
echo "--- the whole status: $kubectl --kubeconfig $KUBECONFIG -n $ns get crun conversion-rate -o yaml"
[ "$phase" = Succeeded ]

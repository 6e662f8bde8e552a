#!/usr/bin/env bash
# Applies examples/coderun.yaml to the running local cluster and prints the finished status.
set -euo pipefail
kubectl=${1:?usage: demo.sh KUBECTL}
here=$(cd "$(dirname "$0")" && pwd)
ns=coderun-demo
k() { "$kubectl" --kubeconfig "${KUBECONFIG:?}" "$@"; }

k create namespace $ns --dry-run=client -o yaml | k apply -f - >/dev/null
k label namespace $ns pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null
k -n $ns delete coderun conversion-rate --ignore-not-found --wait=true >/dev/null
k -n $ns apply -f "$here/coderun.yaml"
echo "waiting for the run to finish..."
deadline=$((SECONDS + 120))
until phase=$(k -n $ns get coderun conversion-rate -o jsonpath='{.status.phase}') &&
      [[ $phase == Succeeded || $phase == Failed || $phase == Rejected ]]; do
  [ $SECONDS -lt $deadline ] || { echo "no result after 120 s; see \`kubectl -n coderun-system logs -l coderun.io/leader=true\`" \
    "(or .cluster/logs/operator.log after make up-host)" >&2; exit 1; }
  sleep 0.5
done
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

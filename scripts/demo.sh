#!/usr/bin/env bash
# make demo: the main job on the local test cluster. Starts etcd, kube-apiserver,
# kube-controller-manager, the local node and the operator; applies config/samples; shows
# `kubectl get orchard -A`; runs a command in a sandbox; waits for the RolloutGroup's balanced group and
# prints it; then tears everything down.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR=${CARGO_TARGET_DIR:-target}
INFO="$TARGET_DIR/local-cluster.json"
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "starting the local cluster (etcd, kube-apiserver, kube-controller-manager, local node, operator)"
"$TARGET_DIR/debug/orchard-local-cluster" --info-file "$INFO" > "$TARGET_DIR/local-cluster.out" 2>&1 &
CLUSTER=$!
cleanup() {
  step "tearing down"
  kill -TERM "$CLUSTER" 2>/dev/null || true
  wait "$CLUSTER" 2>/dev/null || true
  echo "done"
}
trap cleanup EXIT
for _ in $(seq 1 600); do
  [ -s "$INFO" ] && break
  if ! kill -0 "$CLUSTER" 2>/dev/null; then cat "$TARGET_DIR/local-cluster.out"; exit 1; fi
  sleep 0.2
done
[ -s "$INFO" ] || { echo "the local cluster did not start in 120 s"; cat "$TARGET_DIR/local-cluster.out"; exit 1; }
field() { python3 -c "import json,sys; print(json.load(open('$INFO'))['$1'] or '')"; }
export KUBECONFIG=$(field kubeconfig)
GATEWAY=$(field gatewayURL)
TOKEN=$(field adminToken)
grep -h "ready in" "$TARGET_DIR/local-cluster.out" || true
echo "KUBECONFIG=$KUBECONFIG"
kubectl get nodes

step "applying config/samples (kubectl apply -k)"
kubectl apply -k config/samples/

step "kubectl get orchard -A"
kubectl get orchard -A

SANDBOX=$(kubectl get sandboxes -o name | grep -v -- '-[0-9]*$' | head -n1 | cut -d/ -f2)
step "waiting for sandbox/$SANDBOX to be Ready"
kubectl wait --for=condition=Ready "sandbox/$SANDBOX" --timeout=60s
kubectl get sandbox "$SANDBOX"

step "running a command in sandbox/$SANDBOX through the gateway (POST .../exec)"
curl -sS -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
  -d '{"argv": ["/bin/sh", "-c", "echo hello from $ORCHARD_SANDBOX; uname -sr"]}' \
  "$GATEWAY/v1/namespaces/default/sandboxes/$SANDBOX/exec" | python3 -m json.tool

GROUP=$(kubectl get rolloutgroups -o name | head -n1 | cut -d/ -f2)
if [ -n "$GROUP" ]; then
  step "waiting for rolloutgroup/$GROUP to be Complete (Balanced Adaptive Rollout)"
  kubectl wait --for=condition=Complete "rolloutgroup/$GROUP" --timeout=180s
  kubectl get rolloutgroup "$GROUP"
  step "the group a trainer reads from status.group"
  kubectl get rolloutgroup "$GROUP" -o jsonpath='{.status}' | python3 -c '
import json, sys
status = json.load(sys.stdin)
print("selection={} positives={} launched={}".format(
    status.get("selection"), status.get("positives"), status.get("trajectoriesLaunched")))
for member in status.get("group", []):
    print("  {:<24} reward={:<6} status={:<10} length={}".format(
        member["name"], member["reward"], member["status"], member.get("length")))
'
fi

step "kubectl get orchard -A"
kubectl get orchard -A

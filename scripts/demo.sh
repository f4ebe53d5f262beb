#!/usr/bin/env bash
# make demo: the main job on the local test cluster. Starts etcd, kube-apiserver,
# kube-controller-manager, a node and the operator; applies config/samples; shows `kubectl get orchard
# -A`; runs a command in a sandbox; waits for the RolloutGroup's balanced group and prints it; then tears
# everything down. The node is the real node (kubelet, containerd, runc: every sandbox a real container
# from an image built here) wherever it can run, else the hollow node, saying why.
# ORCHARD_DEMO_NODE=real|hollow forces one.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR=${CARGO_TARGET_DIR:-target}
INFO="$TARGET_DIR/local-cluster.json"
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

CLUSTER=
cleanup() {
  [ -n "$CLUSTER" ] || return 0
  step "tearing down"
  kill -TERM "$CLUSTER" 2>/dev/null || true
  wait "$CLUSTER" 2>/dev/null || true
  echo "done"
}
trap cleanup EXIT

# start_cluster NODE: starts orchard-local-cluster with NODE (real|hollow); fails if it exits early.
start_cluster() {
  local flag=()
  [ "$1" = real ] && flag=(--real-node)
  rm -f "$INFO"
  "$TARGET_DIR/debug/orchard-local-cluster" "${flag[@]}" --info-file "$INFO" > "$TARGET_DIR/local-cluster.out" 2>&1 &
  CLUSTER=$!
  for _ in $(seq 1 900); do
    [ -s "$INFO" ] && return 0
    if ! kill -0 "$CLUSTER" 2>/dev/null; then wait "$CLUSTER" 2>/dev/null || true; CLUSTER=; return 1; fi
    sleep 0.2
  done
  echo "the local cluster did not start in 180 s"; cat "$TARGET_DIR/local-cluster.out"; exit 1
}

NODE=${ORCHARD_DEMO_NODE:-auto}
if [ "$NODE" != hollow ]; then
  step "starting the local cluster on the real node (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, containerd, operator)"
  if start_cluster real; then
    NODE=real
  elif [ "$NODE" = real ]; then
    cat "$TARGET_DIR/local-cluster.out"; exit 1
  else
    echo "the real node cannot run here: $(tail -n 1 "$TARGET_DIR/local-cluster.out")"
    echo "falling back to the hollow node (each sandbox's agent a host process, no container)"
    NODE=hollow
  fi
fi
if [ "$NODE" = hollow ]; then
  step "starting the local cluster on the hollow node (etcd, kube-apiserver, kube-controller-manager, hollow node, operator)"
  start_cluster hollow || { cat "$TARGET_DIR/local-cluster.out"; exit 1; }
fi
field() { python3 -c "import json,sys; print(json.load(open('$INFO'))['$1'] or '')"; }
export KUBECONFIG=$(field kubeconfig)
GATEWAY=$(field gatewayURL)
TOKEN=$(field adminToken)
grep -h "ready in" "$TARGET_DIR/local-cluster.out" || true
echo "KUBECONFIG=$KUBECONFIG"
kubectl get nodes

if [ "$NODE" = real ]; then
  step "applying config/samples with the images built here (kubectl apply -k e2e/demo-real-node)"
  kubectl apply -k e2e/demo-real-node/
else
  step "applying config/samples (kubectl apply -k)"
  kubectl apply -k config/samples/
fi

step "kubectl get orchard -A"
kubectl get orchard -A

SANDBOX=$(kubectl get sandboxes -o name | grep -v -- '-[0-9]*$' | head -n1 | cut -d/ -f2)
step "waiting for sandbox/$SANDBOX to be Ready"
kubectl wait --for=condition=Ready "sandbox/$SANDBOX" --timeout=180s
kubectl get sandbox "$SANDBOX"

step "running a command in sandbox/$SANDBOX through the gateway (POST .../exec)"
curl -sS -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
  -d '{"argv": ["/bin/sh", "-c", "echo hello from $ORCHARD_SANDBOX on $(uname -n); grep ^PRETTY_NAME= /etc/os-release; xargs -0 echo PID 1: < /proc/1/cmdline"]}' \
  "$GATEWAY/v1/namespaces/default/sandboxes/$SANDBOX/exec" | python3 -m json.tool

step "a warm pool (SandboxPool busybox-warm): sandbox/from-pool claims one of its members"
kubectl wait --for=condition=Ready sandbox/from-pool --timeout=180s
echo "sandbox/from-pool runs in pod $(kubectl get sandbox from-pool -o jsonpath='{.status.podName}')"
kubectl get sbxpool

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

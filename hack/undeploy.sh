#!/usr/bin/env bash
# Uninstalls ip-preallocator (the manifest make release writes) in the order that strands no claim:
#
#  1. The mutating webhook configuration goes: the API server stops calling the webhook, no claim
#     is preallocated any more, and CAPM3 creates the claims of every new Metal3Data itself.
#  2. The replicas, still running, finish every claim that waits for its Metal3Data: each hands
#     over its claims when the Metal3Data is stored, and the leader deletes one once
#     --release-grace-period (2m by default) has passed without it, the IPAM has answered it, no
#     Metal3DataClaim still waits for it and no other IPClaim of its pool waits for the IPAM;
#     those waits last at most --release-hold-limit (10m by default) more. A waiting claim carries the
#     ip-preallocator.metal3.io/preallocated-for annotation; a finished one does not exist or no
#     longer carries it.
#  3. Everything else goes: the Deployment, the validating webhook, RBAC, certificates, namespace.
#
# Removing the Deployment before step 2 ends would leave waiting claims that nothing hands over or
# releases, holding addresses, until someone deletes them by hand.
#
# Usage: hack/undeploy.sh out/install.yaml   (KUBECTL, UNDEPLOY_TIMEOUT in seconds: optional)
set -euo pipefail

manifest=${1:?usage: $0 <install.yaml>}
kubectl=${KUBECTL:-kubectl}
timeout=${UNDEPLOY_TIMEOUT:-900}
claims=ipclaims.ipam.metal3.io,ipaddressclaims.ipam.cluster.x-k8s.io
waiting_claims='{range .items[?(@.metadata.annotations.ip-preallocator\.metal3\.io/preallocated-for)]}{.kind}/{.metadata.namespace}/{.metadata.name}{"\n"}{end}'

echo "Removing the mutating webhook: no more preallocation"
$kubectl delete mutatingwebhookconfiguration -l app.kubernetes.io/part-of=ip-preallocator --ignore-not-found

echo "Waiting for the replicas to finish the claims that wait for their Metal3Data"
deadline=$((SECONDS + timeout))
while :; do
  waiting=$($kubectl get "$claims" --all-namespaces -o jsonpath="$waiting_claims")
  if [ -z "$waiting" ]; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "Claims still wait after ${timeout}s; ip-preallocator is left running so that it can finish them:" >&2
    echo "$waiting" >&2
    echo "Check that its pods are ready and its leader's log, then run this again." >&2
    exit 1
  fi
  echo "$(echo "$waiting" | wc -l) claim(s) waiting"
  sleep 2
done

echo "Removing the rest"
$kubectl delete -f "$manifest" --ignore-not-found

#!/usr/bin/env bash
# Proves an install works, with kubectl only, on the cluster of the current kubeconfig: it admits
# one Metal3Data in a throw-away namespace, shows the IP claims the webhook preallocated for it and
# their hand-over, and removes everything it created. PASS or FAIL, with the reason, is the last line.
#
# A Metal3Data is normally created by CAPM3's Metal3DataTemplate controller; the verify creates
# one itself, as that controller does (name <template>-<index>, the Metal3DataClaim's labels, its
# three owner references), beside what admission reads: a Cluster (not paused: the webhook leaves
# a paused cluster's Metal3Data to CAPM3), a BareMetalHost, a Machine, a Metal3Machine, a
# Metal3DataClaim, a Metal3DataTemplate and the Metal3 IPPool the template names. It needs no
# controller to act on them, and keeps the ones that would act away from them:
#  - the Metal3DataTemplate and the IPPool carry Cluster API's paused annotation, which CAPM3 and
#    the Metal3 IPAM honour on them and the webhook does not read: CAPM3 creates no Metal3Data for
#    the Metal3DataClaim, the IPAM hands out no address;
#  - the BareMetalHost carries the Bare Metal Operator's paused annotation;
#  - the Cluster has no infrastructure, so CAPM3 associates the Metal3Machine with no host;
#  - the Metal3Data has no finalizer (CAPM3's template controller would add one, and remove it).
# A CAPM3 that watches the namespace may still reconcile the Metal3Data; then it releases the
# claims itself when the Metal3Data goes, after the Metal3DataClaim, which is deleted first.
#
# Dry-run admissions are skipped by design (the webhook's claims are side effects), so the verify
# stores real objects and deletes them: the Metal3Data first, then it waits until its claims are
# gone (the webhook's leader removes CAPM3's finalizer from the claims of a Metal3Data CAPM3 never
# reconciled), then the namespace, until it is gone.
#
# Usage: hack/verify-install.sh
#   KUBECTL (default kubectl), VERIFY_TIMEOUT (seconds for the hand-over and for each step of the
#   clean-up, default 60), IP_PREALLOCATOR_NAMESPACE (default ip-preallocator-system): optional.
set -euo pipefail

read -ra kubectl <<<"${KUBECTL:-kubectl}"
timeout=${VERIFY_TIMEOUT:-60}
install_ns=${IP_PREALLOCATOR_NAMESPACE:-ip-preallocator-system}
part_of=app.kubernetes.io/part-of=ip-preallocator
m3=infrastructure.cluster.x-k8s.io
verify_label=ip-preallocator.metal3.io/verify
data_finalizer=metal3data.$m3
paused="cluster.x-k8s.io/paused: ip-preallocator-verify"

suffix=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
ns=ip-preallocator-verify-$suffix
name=verify
data=$name-0

k() { "${kubectl[@]}" "$@"; }

tmp=$(mktemp -d)
ns_created=false
data_created=false
claims=()
failure=

# fail ends the verify; the clean-up prints the reason last.
fail() {
  failure=$*
  exit 1
}

# wait_gone waits until kubectl get "$@" finds nothing; it prints what is left when it times out.
wait_gone() {
  local what=$1 deadline=$((SECONDS + timeout)) left
  shift
  while :; do
    if left=$(k get "$@" --ignore-not-found -o name 2>&1) && [ -z "$left" ]; then
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "  $what still there after ${timeout}s:"
      k get "$@" --ignore-not-found \
        -o custom-columns='NAME:.metadata.name,DELETING-SINCE:.metadata.deletionTimestamp,FINALIZERS:.metadata.finalizers[*]' 2>&1 | sed 's/^/    /'
      return 1
    fi
    sleep 0.5
  done
}

cleanup() {
  local rc=$? ok=true
  trap - EXIT INT TERM
  set +e
  if $ns_created; then
    echo
    echo "Cleaning up namespace $ns"
    if $data_created; then
      # The Metal3DataClaim first: CAPM3, if it reconciled the Metal3Data, waits for it to go.
      k delete -n "$ns" "metal3dataclaims.$m3/$name" "metal3datas.$m3/$data" --ignore-not-found --wait=false >/dev/null
      wait_gone "Metal3Data $data" -n "$ns" "metal3datas.$m3" "$data" || ok=false
      echo "  Metal3Data $data is gone; waiting for the claims of the namespace to go (the garbage collector deletes them, the webhook's leader or CAPM3 removes CAPM3's finalizer)"
      wait_gone "claims" -n "$ns" "$claim_resources" || {
        ok=false
        echo "  A claim kept by CAPM3's finalizer ($data_finalizer) waits for the webhook's leader or CAPM3: check they run."
      }
    fi
    k delete namespace "$ns" --ignore-not-found --wait=false >/dev/null
    wait_gone "namespace $ns" namespace "$ns" || ok=false
    if $ok; then
      echo "  namespace $ns and everything in it are gone"
    fi
  fi
  rm -rf "$tmp"
  if ! $ok; then
    failure="${failure:+$failure; and }verify-install could not remove everything it created (above): delete namespace $ns once it is unblocked"
  fi
  echo
  if [ -n "$failure" ]; then
    echo "FAIL: $failure"
    [ "$rc" -ne 0 ] || rc=1
  elif [ "$rc" -eq 0 ]; then
    echo "PASS: ip-preallocator preallocated ${#claims[@]} claim(s) for Metal3Data $data at admission and handed them over to it; nothing is left"
  else
    echo "FAIL: verify-install stopped (exit code $rc); the error is above"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# diagnose says why a Metal3Data was admitted without claims, from what kubectl can read.
diagnose() {
  set +e
  local cause=false
  echo "What kubectl can see:"
  if [ -s "$tmp/warnings" ]; then
    echo "  - the API server passed on these admission warnings:"
    sed 's/^/      /' "$tmp/warnings"
  fi
  local mwc mwc_name ca svc_ns svc nssel objsel
  if ! mwc=$(k get mutatingwebhookconfigurations -l "$part_of" -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.webhooks[0].clientConfig.caBundle}{"|"}{.webhooks[0].clientConfig.service.namespace}{"|"}{.webhooks[0].clientConfig.service.name}{"|"}{.webhooks[0].namespaceSelector}{"|"}{.webhooks[0].objectSelector}{"\n"}{end}' 2>&1); then
    echo "  - cannot read the MutatingWebhookConfigurations: $mwc"
  elif [ -z "$mwc" ]; then
    cause=true
    echo "  - no MutatingWebhookConfiguration labelled $part_of exists: the API server calls no ip-preallocator webhook (uninstalled, or the install is incomplete: kubectl apply -f out/install.yaml)"
  else
    IFS='|' read -r mwc_name ca svc_ns svc nssel objsel <<<"$mwc"
    if [ -z "$ca" ]; then
      cause=true
      echo "  - $mwc_name has no caBundle: cert-manager's CA injector has not filled it (kubectl wait -n $install_ns --for=condition=Ready certificates.cert-manager.io --all)"
    fi
    if [ -n "$nssel" ] && [ "$nssel" != "{}" ]; then
      echo "  - $mwc_name selects namespaces $nssel"
    fi
    if [ -n "$objsel" ] && [ "$objsel" != "{}" ]; then
      echo "  - $mwc_name selects objects $objsel"
    fi
    local ready
    ready=$(k get endpointslices -n "$svc_ns" -l "kubernetes.io/service-name=$svc" \
      -o jsonpath='{range .items[*].endpoints[*]}{.conditions.ready}{"\n"}{end}' 2>/dev/null | grep -c true)
    if [ "$ready" -eq 0 ]; then
      cause=true
      echo "  - Service $svc_ns/$svc has no ready endpoint: no replica of the webhook answers, and the API server admits unchanged (failurePolicy Ignore)"
    else
      echo "  - Service $svc_ns/$svc has $ready ready endpoint(s)"
    fi
  fi
  local verdict
  verdict=$(k events -n "$install_ns" 2>/dev/null | grep -E 'CAPM3(Compatible|NotFound|VersionNotMirrored|NamingDiffers)' | tail -n 1)
  if [ -n "$verdict" ] && ! grep -q CAPM3Compatible <<<"$verdict"; then
    cause=true
    echo "  - the webhook skips every admission as IncompatibleCAPM3; the last Event on its pod says why:"
    echo "      $verdict"
  elif [ -n "$verdict" ]; then
    echo "  - the webhook found a CAPM3 it preallocates beside (its last CheckCAPM3 Event is CAPM3Compatible)"
  fi
  local events line
  events=$(k events -n "$ns" --for "metal3data/$data" --types=Warning 2>/dev/null | grep -v '^No events')
  if [ -n "$events" ]; then
    echo "  - Warning Events of Metal3Data $data:"
    while IFS= read -r line; do echo "      $line"; done <<<"$events"
  fi
  if ! $cause; then
    echo "  - the webhook was called, or should have been, and skipped the admission: ip_preallocator_admissions_total{outcome=\"skipped\"} counts it under its reason (docs/troubleshooting.md lists them; its log says it at -v=1)"
  fi
  set -e
}

echo "Verifying ip-preallocator on the cluster of context $(k config current-context 2>/dev/null || echo '<none>')"

# What the verify creates must exist as kinds.
required="clusters.cluster.x-k8s.io machines.cluster.x-k8s.io metal3datas.$m3 metal3dataclaims.$m3 metal3datatemplates.$m3 metal3machines.$m3 baremetalhosts.metal3.io ippools.ipam.metal3.io ipclaims.ipam.metal3.io"
# shellcheck disable=SC2086 # a list of names
crds=$(k get crd $required ipaddressclaims.ipam.cluster.x-k8s.io --ignore-not-found -o name) || fail "cannot read CustomResourceDefinitions: $crds"
for crd in $required; do
  grep -qx "customresourcedefinition.apiextensions.k8s.io/$crd" <<<"$crds" || fail "CRD $crd is missing: install CAPM3, Cluster API, the Bare Metal Operator's CRDs and the Metal3 IPAM first"
done
claim_resources=ipclaims.ipam.metal3.io
if grep -q ipaddressclaims <<<"$crds"; then
  claim_resources+=,ipaddressclaims.ipam.cluster.x-k8s.io
fi

# The webhook's scope: admissions outside it are skipped as OutOfScope.
labels="    cluster.x-k8s.io/cluster-name: $name
    $verify_label: \"$suffix\""
as=()
args=$(k get deployments -n "$install_ns" -l "$part_of" -o jsonpath='{range .items[*].spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}' 2>/dev/null || true)
if [ -z "$args" ]; then
  echo "No Deployment labelled $part_of in namespace $install_ns (set IP_PREALLOCATOR_NAMESPACE if it is elsewhere); verifying anyway"
fi
flag_value() {
  awk -v flag="--$1" '$0 == flag { getline; print; exit } index($0, flag "=") == 1 { print substr($0, length(flag) + 2); exit }' <<<"$args"
}
only_ns=$(flag_value namespace)
if [ -n "$only_ns" ]; then
  fail "the webhook serves only namespace $only_ns (--namespace): verify-install admits in a namespace of its own, which it would skip as OutOfScope"
fi
watch_filter=$(flag_value watch-filter)
if [ -n "$watch_filter" ]; then
  labels+="
    cluster.x-k8s.io/watch-filter: \"$watch_filter\""
fi
requesters=$(flag_value preallocate-for-requesters)
if [ -n "$requesters" ]; then
  as=("--as=${requesters%%,*}")
  echo "The webhook preallocates only for --preallocate-for-requesters=$requesters: creating the Metal3Data as ${requesters%%,*}"
fi

m3m_uid='' dataclaim_uid=''
# create creates the objects of standard input and sets the variable $1 to the UID of the last.
create() {
  local out
  if ! out=$(k create -f - -o jsonpath='{.metadata.uid}' 2>"$tmp/errors"); then
    fail "creating $2: $(cat "$tmp/errors")"
  fi
  printf -v "$1" %s "$out"
}

echo "Creating namespace $ns: a Cluster, an IPPool, a Metal3DataTemplate, a BareMetalHost, a Machine, a Metal3Machine and a Metal3DataClaim"
ns_created=true
create _ "namespace $ns" <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  labels:
    $verify_label: "$suffix"
EOF

create _ "the Cluster, IPPool, Metal3DataTemplate, BareMetalHost and Machine" <<EOF
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: $name
  namespace: $ns
  labels:
$labels
spec:
  paused: false
---
apiVersion: ipam.metal3.io/v1alpha1
kind: IPPool
metadata:
  name: $name
  namespace: $ns
  labels:
$labels
  annotations:
    $paused
spec:
  clusterName: $name
  namePrefix: $name
  pools:
  - start: 192.0.2.10
    end: 192.0.2.20
  prefix: 24
---
apiVersion: $m3/v1beta2
kind: Metal3DataTemplate
metadata:
  name: $name
  namespace: $ns
  labels:
$labels
  annotations:
    $paused
spec:
  clusterName: $name
  metaData:
    ipAddressesFromPool:
    - key: ip
      name: $name
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: $name
  namespace: $ns
  labels:
$labels
  annotations:
    baremetalhost.metal3.io/paused: ip-preallocator-verify
spec:
  online: false
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Machine
metadata:
  name: $name
  namespace: $ns
  labels:
$labels
spec:
  clusterName: $name
  bootstrap:
    dataSecretName: $name-bootstrap
  infrastructureRef:
    apiGroup: $m3
    kind: Metal3Machine
    name: $name
EOF
uids=$(k get -n "$ns" "metal3datatemplates.$m3/$name" "machines.cluster.x-k8s.io/$name" -o jsonpath='{range .items[*]}{.metadata.uid}{" "}{end}')
read -r template_uid machine_uid <<<"$uids"

create m3m_uid "the Metal3Machine" <<EOF
apiVersion: $m3/v1beta2
kind: Metal3Machine
metadata:
  name: $name
  namespace: $ns
  labels:
$labels
  annotations:
    metal3.io/BareMetalHost: $ns/$name
  ownerReferences:
  - apiVersion: cluster.x-k8s.io/v1beta2
    kind: Machine
    name: $name
    uid: $machine_uid
    controller: true
spec:
  dataTemplate:
    name: $name
  image:
    url: http://images.example.com/verify.qcow2
    checksum: http://images.example.com/verify.qcow2.sha256sum
EOF

create dataclaim_uid "the Metal3DataClaim" <<EOF
apiVersion: $m3/v1beta2
kind: Metal3DataClaim
metadata:
  name: $name
  namespace: $ns
  labels:
$labels
  ownerReferences:
  - apiVersion: $m3/v1beta2
    kind: Metal3Machine
    name: $name
    uid: $m3m_uid
    controller: true
spec:
  template:
    name: $name
    namespace: $ns
EOF

echo "Creating Metal3Data $data as CAPM3's Metal3DataTemplate controller does"
data_created=true
if ! out=$(k "${as[@]}" create -f - -o jsonpath='{.metadata.uid}{"|"}{.metadata.annotations.ip-preallocator\.metal3\.io/claims}' 2>"$tmp/warnings" <<EOF
apiVersion: $m3/v1beta2
kind: Metal3Data
metadata:
  name: $data
  namespace: $ns
  labels:
$labels
  ownerReferences:
  - apiVersion: $m3/v1beta2
    kind: Metal3DataTemplate
    name: $name
    uid: $template_uid
    controller: true
  - apiVersion: $m3/v1beta2
    kind: Metal3DataClaim
    name: $name
    uid: $dataclaim_uid
  - apiVersion: $m3/v1beta2
    kind: Metal3Machine
    name: $name
    uid: $m3m_uid
spec:
  index: 0
  template:
    name: $name
    namespace: $ns
  claim:
    name: $name
    namespace: $ns
EOF
); then
  fail "creating Metal3Data $data: $(cat "$tmp/warnings")"
fi
IFS='|' read -r data_uid recorded <<<"$out"

if [ -z "$recorded" ]; then
  echo "Metal3Data $data was admitted without the annotation ip-preallocator.metal3.io/claims."
  diagnose
  fail "nothing was preallocated: the webhook did not preallocate the claims of Metal3Data $data"
fi
IFS=, read -ra claims <<<"$recorded"
echo "The webhook recorded on Metal3Data $data: ip-preallocator.metal3.io/claims=$recorded"

for claim in "${claims[@]}"; do
  case ${claim%%/*} in
  IPClaim | IPAddressClaim) ;;
  *) fail "Metal3Data $data records a claim of a kind verify-install does not know: $claim" ;;
  esac
done
resource_of() {
  case $1 in
  IPClaim) echo ipclaims.ipam.metal3.io ;;
  IPAddressClaim) echo ipaddressclaims.ipam.cluster.x-k8s.io ;;
  esac
}

# Handed over: owned by this Metal3Data (its UID) and carrying CAPM3's finalizer, as CAPM3 creates it.
echo "Waiting up to ${timeout}s for the hand-over: each claim owned by Metal3Data $data (uid $data_uid) with CAPM3's finalizer $data_finalizer"
deadline=$((SECONDS + timeout))
while :; do
  pending=()
  for claim in "${claims[@]}"; do
    state=$(k get -n "$ns" "$(resource_of "${claim%%/*}")" "${claim#*/}" --ignore-not-found \
      -o jsonpath='{.metadata.ownerReferences[?(@.kind=="Metal3Data")].uid}{"|"}{.metadata.finalizers[*]}') || state=
    IFS='|' read -r owner finalizers <<<"$state"
    if [ -z "$state" ]; then
      pending+=("$claim (not found)")
    elif [ "$owner" != "$data_uid" ] || [[ " $finalizers " != *" $data_finalizer "* ]]; then
      pending+=("$claim (waiting)")
    fi
  done
  if [ ${#pending[@]} -eq 0 ]; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    break
  fi
  sleep 0.5
done

echo
k get -n "$ns" "metal3datas.$m3" "$data" -o custom-columns='METAL3DATA:.metadata.name,UID:.metadata.uid,CLAIMS:.metadata.annotations.ip-preallocator\.metal3\.io/claims'
echo
for kind in IPClaim IPAddressClaim; do
  names=()
  for claim in "${claims[@]}"; do
    if [ "${claim%%/*}" = "$kind" ]; then
      names+=("${claim#*/}")
    fi
  done
  if [ ${#names[@]} -gt 0 ]; then
    pool=.spec.pool.name
    if [ "$kind" = IPAddressClaim ]; then
      pool=.spec.poolRef.name
    fi
    k get -n "$ns" "$(resource_of "$kind")" "${names[@]}" --ignore-not-found \
      -o custom-columns="${kind^^}:.metadata.name,POOL:$pool,OWNER:.metadata.ownerReferences[*].kind,OWNER-NAME:.metadata.ownerReferences[*].name,OWNER-UID:.metadata.ownerReferences[*].uid,FINALIZERS:.metadata.finalizers[*],WAITING-FOR:.metadata.annotations.ip-preallocator\.metal3\.io/preallocated-for"
    echo
  fi
done

if [ ${#pending[@]} -gt 0 ]; then
  events=$(k events -n "$ns" --for "metal3data/$data" --types=Warning 2>/dev/null | grep -v '^No events' || true)
  if [ -n "$events" ]; then
    echo "Warning Events of Metal3Data $data:"
    echo "$events"
  fi
  fail "not handed over to Metal3Data $data within ${timeout}s: ${pending[*]} (every replica of the webhook hands over the claims it admitted; check they run)"
fi
echo "Every claim was preallocated at admission and handed over to Metal3Data $data."

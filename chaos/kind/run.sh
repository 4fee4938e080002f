#!/usr/bin/env bash
# The chaos scenarios of chaos/scenarios.tsv on a kind cluster, with the
# operator installed by its Helm chart (helm/secrets-operator) and the dev
# KMS running in the cluster. See chaos/kind/README.md.
#
#   chaos/kind/run.sh [--seed N] [--faults PROCESS,KMS] [--namespaces N]
#                     [--cluster NAME] [--image IMAGE] [--keep]
#
# Needs docker, kind, kubectl, helm, curl, jq; builds the operator image from
# the repository's Dockerfile unless --image names one. Exits non-zero when a
# check fails.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

SEED=$(( $(date +%s) % 100000 ))
FAULTS=17,15
NAMESPACES=16
CLUSTER=kms-chaos
IMAGE=
KEEP=0
while [ $# -gt 0 ]; do
  case $1 in
    --seed) SEED=$2; shift 2 ;;
    --faults) FAULTS=$2; shift 2 ;;
    --namespaces) NAMESPACES=$2; shift 2 ;;
    --cluster) CLUSTER=$2; shift 2 ;;
    --image) IMAGE=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
PROCESS_FAULTS=${FAULTS%,*}
KMS_FAULTS=${FAULTS#*,}

# Same timings as the local runner's profiles (chaos/src/profile.rs).
LEASE=5 RENEW=3 RETRY=1 SHARDS=16 RATE=10 MIN_REPLICAS=2 MAX_REPLICAS=4 REPLICAS=3
OPNS=kms-operator-system KMSNS=kms-chaos-kms RELEASE=kms-operator
STS=$RELEASE-controller-manager
ADMIN_TOKEN=chaos-admin
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kms-chaos-kind.XXXXXX")
NODE=$CLUSTER-control-plane
FAILED=0
say() { echo "kind-chaos: $*" >&2; }
fail() { say "FAIL: $*"; FAILED=1; }
for tool in docker kind kubectl helm curl jq; do
  command -v "$tool" >/dev/null || { say "$tool is required"; exit 2; }
done

cleanup() {
  [ -n "${PF_PID:-}" ] && kill "$PF_PID" 2>/dev/null || true
  [ -n "${WATCH_PID:-}" ] && kill "$WATCH_PID" 2>/dev/null || true
  if [ "$KEEP" = 0 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

# --- the scenarios (shared with the local runner) -------------------------
declare -A WEIGHT HOLD_MIN HOLD_MAX TRACK
while read -r kind track weight hold _; do
  case $kind in ''|'#'*) continue ;; esac
  case $kind in
    kill|term|pause|apiserver-restart|etcd-restart|cache-delete|cache-corrupt|scale-up|scale-down) ;;
    kms-outage|kms-latency|kms-429|kms-5xx|kms-drop) ;;
    *) say "scenario $kind has no kind implementation: update chaos/kind/run.sh"; exit 2 ;;
  esac
  TRACK[$kind]=$track WEIGHT[$kind]=$weight HOLD_MIN[$kind]=${hold%-*} HOLD_MAX[$kind]=${hold#*-}
done < "$REPO/chaos/scenarios.tsv"

# Random draws go through globals, never `$(...)`: a command substitution runs
# in a subshell, whose draws would not advance this shell's sequence.
RANDOM=$SEED
rand() { R=$(( (RANDOM << 15 | RANDOM) % $1 )); }   # R in 0..$1-1
hold_of() { rand $(( HOLD_MAX[$1] - HOLD_MIN[$1] + 1 )); HOLD=$(( HOLD_MIN[$1] + R )); }
pick_kind() { # track replicas → KIND
  local total=0 k kinds=()
  for k in $(printf '%s\n' "${!TRACK[@]}" | sort); do
    [ "${TRACK[$k]}" = "$1" ] || continue
    case $k in scale-up) [ "$2" -lt $MAX_REPLICAS ] || continue ;; scale-down) [ "$2" -gt $MIN_REPLICAS ] || continue ;; esac
    kinds+=("$k"); total=$(( total + WEIGHT[$k] ))
  done
  rand $total
  local x=$R
  for k in "${kinds[@]}"; do
    if [ "$x" -lt "${WEIGHT[$k]}" ]; then KIND=$k; return; fi
    x=$(( x - WEIGHT[$k] ))
  done
}

# --- cluster, image, dev KMS, chart ---------------------------------------
say "seed $SEED; cluster $CLUSTER; work files in $WORK"
kind create cluster --name "$CLUSTER" --wait 120s
if [ -z "$IMAGE" ]; then
  [ -f "$REPO/Dockerfile" ] || { say "no Dockerfile at the repository root: pass --image"; exit 2; }
  IMAGE=kms-operator:chaos
  docker build -t "$IMAGE" "$REPO"
fi
kind load docker-image "$IMAGE" --name "$CLUSTER"

NSES=()
for i in $(seq 0 $((NAMESPACES - 1))); do NSES+=("chaos-$(printf %02d "$i")"); done
{
  echo "projects:"
  echo "  - slug: chaos"
  echo "    environments: [dev]"
  echo "    secrets:"
  echo "      dev:"
  echo "        /shared: {S0: s0-$SEED, S1: s1-$SEED}"
  for ns in "${NSES[@]}"; do echo "        /apps/$ns: {K0: k0-$SEED, K1: k1-$SEED}"; done
  echo "    dynamicSecrets:"
  echo "      - {name: db-creds, environment: dev, path: /, defaultTTL: 30s, maxTTL: 90s}"
  echo "identities:"
  echo "  - name: operator"
  echo "    universalAuth: {clientId: chaos-client, clientSecret: chaos-secret}"
  echo "    projects: [chaos]"
} > "$WORK/seed.yaml"
kubectl create namespace "$KMSNS"
kubectl -n "$KMSNS" create configmap kms-seed --from-file=seed.yaml="$WORK/seed.yaml"
kubectl -n "$KMSNS" apply -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: kms-dev}
spec:
  replicas: 1
  selector: {matchLabels: {app: kms-dev}}
  template:
    metadata: {labels: {app: kms-dev}}
    spec:
      containers:
        - name: kms
          image: $IMAGE
          imagePullPolicy: Never
          args: [dev-server, --addr, 0.0.0.0:8080, --seed, /seed/seed.yaml, --admin-token, $ADMIN_TOKEN, --min-lease-ttl, 1s]
          ports: [{containerPort: 8080}]
          volumeMounts: [{name: seed, mountPath: /seed}]
      volumes: [{name: seed, configMap: {name: kms-seed}}]
---
apiVersion: v1
kind: Service
metadata: {name: kms-dev}
spec: {selector: {app: kms-dev}, ports: [{port: 8080, targetPort: 8080}]}
YAML
kubectl -n "$KMSNS" rollout status deploy/kms-dev --timeout=120s
kubectl -n "$KMSNS" port-forward svc/kms-dev 18080:8080 >/dev/null 2>&1 &
PF_PID=$!
sleep 2
KMS=http://127.0.0.1:18080
admin() { curl -fsS -X "$1" -H "authorization: Bearer $ADMIN_TOKEN" -H 'content-type: application/json' "$KMS/admin/$2" ${3:+-d "$3"}; }
HOST_API=http://kms-dev.$KMSNS.svc:8080/api

helm install "$RELEASE" "$REPO/helm/secrets-operator" --namespace "$OPNS" --create-namespace \
  --set fullnameOverride=$RELEASE \
  --set replicaCount=$REPLICAS \
  --set sharding.shards=$SHARDS \
  --set leaderElection.leaseDuration=${LEASE}s \
  --set leaderElection.renewDeadline=${RENEW}s \
  --set leaderElection.retryPeriod=${RETRY}s \
  --set kms.rateLimit=$RATE \
  --set hostAPI=$HOST_API \
  --set controllerManager.manager.image.repository="${IMAGE%:*}" \
  --set controllerManager.manager.image.tag="${IMAGE##*:}" \
  --set controllerManager.manager.image.pullPolicy=Never \
  --set controllerManager.terminationGracePeriodSeconds=30 \
  --set cache.persistence.enabled=true \
  --wait --timeout 5m

# --- workload ---------------------------------------------------------------
for ns in "${NSES[@]}"; do
  kubectl create namespace "$ns" >/dev/null
  kubectl -n "$ns" create secret generic kms-credentials --from-literal=clientId=chaos-client --from-literal=clientSecret=chaos-secret >/dev/null
  kubectl -n "$ns" create secret generic push-src --from-literal=P0=p0-$SEED --from-literal=P1=p1-$SEED >/dev/null
  kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: secrets.hanzo.ai/v1alpha1
kind: KmsSecret
metadata: {name: app}
spec:
  hostAPI: $HOST_API
  syncConfig: {resyncInterval: 20s}
  authentication: {universalAuth: {credentialsRef: {secretName: kms-credentials}, secretsScope: {projectSlug: chaos, envSlug: dev, secretsPath: /apps/$ns}}}
  managedKubeSecretReferences: [{secretName: app-out, creationPolicy: Owner}]
---
apiVersion: secrets.hanzo.ai/v1alpha1
kind: KmsSecret
metadata: {name: shared}
spec:
  hostAPI: $HOST_API
  syncConfig: {resyncInterval: 20s}
  authentication: {universalAuth: {credentialsRef: {secretName: kms-credentials}, secretsScope: {projectSlug: chaos, envSlug: dev, secretsPath: /shared}}}
  managedKubeSecretReferences: [{secretName: shared-out, creationPolicy: Orphan}]
---
apiVersion: secrets.hanzo.ai/v1alpha1
kind: KmsPushSecret
metadata: {name: push}
spec:
  hostAPI: $HOST_API
  resyncInterval: 30s
  destination: {projectSlug: chaos, environmentSlug: dev, secretsPath: /pushed/$ns}
  authentication: {universalAuth: {credentialsRef: {secretName: kms-credentials}}}
  push: {secret: {secretName: push-src}}
---
apiVersion: secrets.hanzo.ai/v1alpha1
kind: KmsDynamicSecret
metadata: {name: db}
spec:
  hostAPI: $HOST_API
  authentication: {universalAuth: {credentialsRef: {secretName: kms-credentials}}}
  dynamicSecret: {secretName: db-creds, projectSlug: chaos, environmentSlug: dev, secretsPath: /}
  leaseTTL: 30s
  leaseRevocationPolicy: Revoke
  managedSecretReference: {secretName: db-out, creationPolicy: Owner}
YAML
done

# Record every shard Lease change for the checkers (kms-chaos
# --analyze-lease-log); a watch that ends (API server restart) starts again
# after a `#relist` marker.
(
  first=1
  while :; do
    [ $first = 1 ] || echo "#relist"
    first=0
    kubectl -n "$OPNS" get leases -w --output-watch-events -o json 2>/dev/null \
      | jq --unbuffered -rc 'select(.object.metadata.name | test("-shard-[0-9]+$"))
          | [(now | todate), .type, .object.metadata.name, (.object.spec.holderIdentity // "-"),
             (.object.spec.acquireTime // "-"), (.object.spec.renewTime // "-"),
             (.object.spec.leaseDurationSeconds // 0)] | @tsv' || true
    sleep 0.2
  done
) > "$WORK/leases.tsv" &
WATCH_PID=$!

converged() { # every KmsSecret target and dynamic Secret present with data
  local ns
  for ns in "${NSES[@]}"; do
    for s in app-out shared-out db-out; do
      [ "$(kubectl -n "$ns" get secret "$s" -o jsonpath='{.data}' 2>/dev/null)" != "" ] || return 1
    done
  done
}
wait_converged() {
  local deadline=$(( SECONDS + $1 ))
  until converged; do [ $SECONDS -lt $deadline ] || return 1; sleep 3; done
}
wait_converged 300 || fail "the workload was not in step after 5 minutes"

# --- faults -----------------------------------------------------------------
pods() { kubectl -n "$OPNS" get pods -l app.kubernetes.io/instance=$RELEASE -o jsonpath='{.items[*].metadata.name}'; }
pick_pod() { local p; read -ra p <<<"$(pods)"; rand ${#p[@]}; POD=${p[$R]}; }
restart_static() { # kube-apiserver|etcd; the window goes into the Lease log
  local from; from=$(date +%s%3N)
  docker exec "$NODE" sh -c "mv /etc/kubernetes/manifests/$1.yaml /tmp/ && sleep 3 && mv /tmp/$1.yaml /etc/kubernetes/manifests/"
  local deadline=$(( SECONDS + 120 ))
  until kubectl get --raw /readyz >/dev/null 2>&1; do [ $SECONDS -lt $deadline ] || break; sleep 1; done
  echo "#control-plane $from $(date +%s%3N)" >> "$WORK/leases.tsv"
}
process_fault() { # kind replicas
  local k=$1 hold pod=; hold_of "$k"; hold=$HOLD
  case $k in
    kill) # the StatefulSet recreates the pod under the same name, with its cache claim
      pick_pod; pod=$POD; kubectl -n "$OPNS" delete pod "$pod" --grace-period=0 --force >/dev/null 2>&1 ;;
    term) pick_pod; pod=$POD; kubectl -n "$OPNS" delete pod "$pod" --wait=false >/dev/null ;;
    pause) # cut the pod off from the API server for longer than its lease
      pick_pod; pod=$POD
      kubectl -n "$OPNS" apply -f - >/dev/null <<YAML
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: chaos-isolate}
spec:
  podSelector: {matchLabels: {statefulset.kubernetes.io/pod-name: $pod}}
  policyTypes: [Egress, Ingress]
YAML
      sleep $(( LEASE + hold )); kubectl -n "$OPNS" delete networkpolicy chaos-isolate >/dev/null ;;
    apiserver-restart) restart_static kube-apiserver ;;
    etcd-restart) restart_static etcd ;;
    cache-delete) # the claim goes with the pod; the StatefulSet makes a new, empty one
      pick_pod; pod=$POD
      kubectl -n "$OPNS" delete pvc "cache-$pod" --wait=false >/dev/null
      kubectl -n "$OPNS" delete pod "$pod" --wait=false >/dev/null ;;
    cache-corrupt) # overwrite the cache from an ephemeral container, then kill the pod at once;
      # it comes back under the same name with the same (damaged) claim. (SIGKILL from inside
      # the pod cannot reach the manager: it is PID 1 of its namespace.)
      pick_pod; pod=$POD
      kubectl -n "$OPNS" debug "pod/$pod" --image=busybox:1.36 --target=manager --profile=sysadmin --attach -- \
        sh -c 'for f in $(find /proc/1/root/var/cache/kms-operator -type f); do dd if=/dev/urandom of="$f" bs=1024 count=4 seek=1 conv=notrunc 2>/dev/null; done' >/dev/null 2>&1 \
        || say "cache-corrupt on $pod: the debug container was refused (ephemeral containers or the sysadmin profile not allowed); killing the pod only"
      kubectl -n "$OPNS" delete pod "$pod" --grace-period=0 --force >/dev/null 2>&1 ;;
    scale-up) kubectl -n "$OPNS" scale statefulset "$STS" --replicas=$(( $2 + 1 )) >/dev/null ;;
    scale-down) kubectl -n "$OPNS" scale statefulset "$STS" --replicas=$(( $2 - 1 )) >/dev/null ;;
  esac
  say "process: $k ${pod:-} (hold ${hold}s)"
  case $k in kill|term|cache-delete|cache-corrupt) sleep "$hold" ;; esac
}
kms_body() { # kind → BODY (the local runner's fault bodies)
  case $1 in
    kms-outage) BODY='{"outage": true}' ;;
    kms-latency) rand 2701; BODY="{\"latencyMs\": $(( 300 + R ))}" ;;
    kms-429) rand 41; BODY="{\"rateLimitPerMinute\": $(( 20 + R ))}" ;;
    kms-5xx) rand 51; BODY="{\"errorRate\": 0.$(( 30 + R )), \"status\": 503, \"seed\": $SEED}" ;;
    kms-drop) BODY='{"dropConnections": true}' ;;
  esac
}
process_track() {
  RANDOM=$(( SEED + 1 ))   # each track its own reproducible sequence
  local replicas=$REPLICAS i k
  for i in $(seq 1 "$PROCESS_FAULTS"); do
    rand 4; sleep $(( 3 + R ))
    pick_kind process "$replicas"; k=$KIND
    process_fault "$k" "$replicas"
    case $k in scale-up) replicas=$((replicas + 1)) ;; scale-down) replicas=$((replicas - 1)) ;; esac
    echo "$k" >> "$WORK/faults.log"
  done
}
kms_track() {
  RANDOM=$(( SEED + 2 ))
  local i k hold
  for i in $(seq 1 "$KMS_FAULTS"); do
    rand 4; sleep $(( 3 + R ))
    pick_kind kms 0; k=$KIND; hold_of "$k"; hold=$HOLD
    kms_body "$k"
    admin POST faults "$BODY" >/dev/null
    sleep "$hold"; admin DELETE faults >/dev/null
    say "kms: $k for ${hold}s"
    echo "$k" >> "$WORK/faults.log"
  done
}
START=$SECONDS
process_track & P1=$!
kms_track & P2=$!
wait $P1 $P2
admin DELETE faults >/dev/null || true
say "faults over after $(( SECONDS - START ))s"

# --- checks -----------------------------------------------------------------
kubectl -n "$OPNS" rollout status statefulset "$STS" --timeout=300s || fail "the StatefulSet did not become ready"
wait_converged 180 || fail "objects did not converge within 180 s after the faults"
for ns in "${NSES[@]}"; do   # KmsSecret targets equal the KMS
  want=$(curl -fsS "$KMS/api/v3/secrets/raw?workspaceSlug=chaos&environment=dev&secretPath=/apps/$ns" \
    -H "authorization: Bearer $(curl -fsS "$KMS/api/v1/auth/universal-auth/login" -H 'content-type: application/json' \
      -d '{"clientId":"chaos-client","clientSecret":"chaos-secret"}' | jq -r .accessToken)" \
    | jq -cS '[.secrets[] | {(.secretKey): .secretValue}] | add')
  got=$(kubectl -n "$ns" get secret app-out -o json | jq -cS '.data | map_values(@base64d)')
  [ "$want" = "$got" ] || fail "$ns/app-out differs from the KMS"
done
for ns in "${NSES[@]}"; do kubectl -n "$ns" delete kmsdynamicsecret db --wait=false >/dev/null; done
sleep 45   # past the lease TTL (30 s): crash orphans have expired
left=$(admin GET leases | jq length)
[ "$left" = 0 ] || fail "$left KMS leases still active after the KmsDynamicSecrets were deleted"
kill "$WATCH_PID" 2>/dev/null || true
if command -v kms-chaos >/dev/null || [ -x "$REPO/target/debug/kms-chaos" ]; then
  CHAOS=$(command -v kms-chaos || echo "$REPO/target/debug/kms-chaos")
  "$CHAOS" --analyze-lease-log "$WORK/leases.tsv" --shards $SHARDS --retry-period $RETRY \
    || fail "the shard Lease history breaks an invariant"
else
  say "kms-chaos not built: the Lease history in $WORK/leases.tsv was not analysed"
fi
say "faults injected: $(sort "$WORK/faults.log" | uniq -c | tr '\n' ' ')"
[ "$FAILED" = 0 ] && say "PASSED (seed $SEED)" || say "FAILED (seed $SEED)"
exit $FAILED

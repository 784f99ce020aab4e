#!/usr/bin/env bash
# What a team admin of team `vision` runs once, before the team's jobs can use the data
# volume, the checkpoint volume, the tokens and the private registry of
# examples/torchrun-job.yaml.
#
# 1. Create the objects in the team's namespace (fairq made it: FAIRQ_KUBE_NAMESPACE_PREFIX
#    + team slug, `fairq-vision` by default). fairq never reads a Secret's value: a job
#    names the Secret and key, and the kubelet puts the value into the pod.
# 2. Allow them on the team's workload policy. A job may name only PVCs, Secrets and pull
#    secrets on these lists (and only of its own team's namespace); anything else is a 400
#    at submit, before anything reaches the cluster.
#
# Needs: kubectl with rights in the namespace, curl, FAIRQ_URL and FAIRQ_TOKEN of a team
# admin of `vision` (or staff). Every change of the policy is in the team's audit log.
set -euo pipefail
NS=${NS:-fairq-vision}
TEAM=${TEAM:-vision}

# The dataset, read-only for jobs; ReadOnlyMany so both replicas (on two nodes) mount it.
kubectl -n "$NS" apply -f - <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: imagenet}
spec:
  accessModes: [ReadOnlyMany]
  resources: {requests: {storage: 2Ti}}
  storageClassName: shared-fs        # your cluster's RWX/ROX class (NFS, CephFS, Lustre, ...)
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: vision-checkpoints}
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 1Ti}}
  storageClassName: shared-fs
YAML

# Tokens: read from the environment here so they are not in your shell history.
kubectl -n "$NS" create secret generic hf-token --from-literal=token="${HF_TOKEN:?set HF_TOKEN}"
kubectl -n "$NS" create secret generic wandb --from-literal=api-key="${WANDB_API_KEY:?set WANDB_API_KEY}"

# The private registry the image comes from.
kubectl -n "$NS" create secret docker-registry regcred \
  --docker-server=registry.example.com \
  --docker-username="${REGISTRY_USER:?set REGISTRY_USER}" \
  --docker-password="${REGISTRY_PASSWORD:?set REGISTRY_PASSWORD}"

# Allow them in fairq (the lists replace the old ones: include what stays allowed).
curl -fsS -X PATCH "$FAIRQ_URL/api/v1/teams/$TEAM/workload-policy/" \
  -H "Authorization: Token $FAIRQ_TOKEN" -H 'Content-Type: application/json' \
  -d '{"allowed_pvcs": ["imagenet", "vision-checkpoints"],
       "allowed_secrets": ["hf-token", "wandb"],
       "allowed_pull_secrets": ["regcred"]}'
echo

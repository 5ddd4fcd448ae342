#!/usr/bin/env bash
# Copies the job's model directory (model.keras, serving/<version>/, metrics.json, checkpoints, logs) from the
# training volume to ./artifacts/model, and the model published for JOB_NAME (make submit-pipeline's and make
# tune-cluster's selection: serving/<version>/ and selection.json, what make serve-cluster serves) to
# ./artifacts/published, each where the volume holds it (make fetch-model). Usage: fetch-model.sh [DESTINATION_DIR]
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/common/settings.sh
load_settings  # the environment wins over the files

check_settings  # every value in its safe character set, before any of them reaches a command
destination=${1:-artifacts}
helper="${JOB_NAME}-fetch-model"
context=$(kube_context)
model_dir="${MODEL_ROOT}/${JOB_NAME}"  # the trainer's TRAINER_MODEL_DIR (k8s/base/trainer-pod.yaml)
# The published base path's folder, as scripts/common/volume_layout.py serving_base_path lays it out.
published_dir="${MOUNT_PATH}/${SELECTION_ROOT}/${JOB_NAME}"
kube() { kubectl --context "$context" "$@"; }

if ! command -v kubectl >/dev/null 2>&1; then
  echo "error: kubectl is not installed: https://kubernetes.io/docs/tasks/tools/" >&2
  exit 1
fi

# kubectl cp needs tar in the pod: the trainer image has it and is already on the cluster's node.
image=$(kube get tfjob "$JOB_NAME" -n "$NAMESPACE" --ignore-not-found \
  -o jsonpath='{.spec.tfReplicaSpecs.Worker.template.spec.containers[0].image}')
image=${image:-${IMAGE:-}}
if [ -z "$image" ]; then
  echo "error: no TFJob $JOB_NAME to take the image from and IMAGE is unset; run via make fetch-model, or IMAGE=name:tag $0" >&2
  exit 1
fi

cleanup() {
  kube delete pod "$helper" -n "$NAMESPACE" --ignore-not-found --wait=false >/dev/null
}
trap cleanup EXIT

kube delete pod "$helper" -n "$NAMESPACE" --ignore-not-found --wait=true >/dev/null
# Pod Security Standard restricted, like every pod of the job (k8s/base/trainer-pod.yaml): it only reads the volume.
kube apply -n "$NAMESPACE" -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $helper
  labels:
    app.kubernetes.io/part-of: tf-multiworker-trainer
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    runAsGroup: 1000
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: fetch
      image: $image
      imagePullPolicy: IfNotPresent
      command: [sleep, "600"]
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
      resources:
        requests: {cpu: 50m, memory: 64Mi, ephemeral-storage: 16Mi}
        limits: {cpu: 500m, memory: 256Mi, ephemeral-storage: 64Mi}
      volumeMounts:
        - name: training-volume
          mountPath: $MOUNT_PATH
          readOnly: true
  volumes:
    - name: training-volume
      persistentVolumeClaim:
        claimName: $VOLUME_CLAIM
EOF
kube wait -n "$NAMESPACE" --for=condition=Ready "pod/$helper" --timeout=180s

on_volume() { kube exec -n "$NAMESPACE" "$helper" -- test -f "$1"; }
# A fresh copy: kubectl cp into an existing directory would nest it.
fetch() {
  mkdir -p "$destination"
  rm -rf "${destination:?}/$2"
  kube cp -n "$NAMESPACE" "$helper:$1" "$destination/$2"
  echo "copied $1 from volume $VOLUME_CLAIM to $destination/$2:"
  ls -l "$destination/$2"
}
fetched=
if on_volume "$model_dir/metrics.json"; then
  fetch "$model_dir" model
  cat "$destination/model/metrics.json"
  echo
  fetched=1
fi
if on_volume "$published_dir/selection.json"; then
  fetch "$published_dir" published
  fetched=1
fi
if [ -z "$fetched" ]; then
  echo "error: volume $VOLUME_CLAIM holds neither $model_dir/metrics.json (a finished job) nor" \
    "$published_dir/selection.json (a published model) yet: has the job or the pipeline succeeded? (make status)" >&2
  exit 1
fi

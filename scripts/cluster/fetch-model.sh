#!/usr/bin/env bash
# Copies the model directory (model.keras, saved_model/, metrics.json, checkpoints, logs) from the
# training volume to ./artifacts/model (make fetch-model). Usage: fetch-model.sh [DESTINATION_DIR]
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/common/settings.sh
load_settings k8s/base/settings.env  # the environment wins over the file

destination=${1:-artifacts}
helper="${JOB_NAME}-fetch-model"

if ! command -v kubectl >/dev/null 2>&1; then
  echo "error: kubectl is not installed: https://kubernetes.io/docs/tasks/tools/" >&2
  exit 1
fi

# kubectl cp needs tar in the pod: the trainer image has it and is already on the cluster's node.
image=$(kubectl get tfjob "$JOB_NAME" -n "$NAMESPACE" --ignore-not-found \
  -o jsonpath='{.spec.tfReplicaSpecs.Worker.template.spec.containers[0].image}')
image=${image:-${IMAGE:-}}
if [ -z "$image" ]; then
  echo "error: no TFJob $JOB_NAME to take the image from and IMAGE is unset; run via make fetch-model, or IMAGE=name:tag $0" >&2
  exit 1
fi

cleanup() {
  kubectl delete pod "$helper" -n "$NAMESPACE" --ignore-not-found --wait=false >/dev/null
}
trap cleanup EXIT

kubectl delete pod "$helper" -n "$NAMESPACE" --ignore-not-found --wait=true >/dev/null
kubectl apply -n "$NAMESPACE" -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $helper
  labels:
    app.kubernetes.io/part-of: tf-multiworker-trainer
spec:
  restartPolicy: Never
  containers:
    - name: fetch
      image: $image
      imagePullPolicy: IfNotPresent
      command: [sleep, "600"]
      volumeMounts:
        - name: training-volume
          mountPath: $MOUNT_PATH
          readOnly: true
  volumes:
    - name: training-volume
      persistentVolumeClaim:
        claimName: $VOLUME_CLAIM
EOF
kubectl wait -n "$NAMESPACE" --for=condition=Ready "pod/$helper" --timeout=180s

if ! kubectl exec -n "$NAMESPACE" "$helper" -- test -f "$TRAINER_MODEL_DIR/metrics.json"; then
  echo "error: no $TRAINER_MODEL_DIR/metrics.json on volume $VOLUME_CLAIM yet: has the job succeeded? (make status)" >&2
  exit 1
fi
mkdir -p "$destination"
# A fresh copy: kubectl cp into an existing directory would nest it.
rm -rf "$destination/model"
kubectl cp -n "$NAMESPACE" "$helper:$TRAINER_MODEL_DIR" "$destination/model"
echo "copied $TRAINER_MODEL_DIR from volume $VOLUME_CLAIM to $destination/model:"
ls -l "$destination/model"
cat "$destination/model/metrics.json"
echo

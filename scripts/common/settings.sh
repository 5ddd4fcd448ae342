# shellcheck shell=bash
# Sourced by the shell scripts: load_settings sets each KEY=VALUE of the settings files (k8s/base/settings.env and
# trainer.env, each room's k8s/engines/<name>/settings.env, scripts/<room>/settings.env and
# trainer/<room>/settings.env) as a default; a variable that is already set and non-empty (the environment, or make's
# values) keeps its value.
load_settings() {
  local key value
  while IFS='=' read -r key value; do
    [[ $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    [[ -n ${!key:-} ]] || printf -v "$key" '%s' "$value"
  done < <(settings_lines)
}

# settings_lines: every settings file's lines, the template's first (settings.py's settings_files is the same list).
settings_lines() {
  local file root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  for file in "$root/k8s/base/settings.env" "$root/k8s/base/trainer.env" "$root"/k8s/engines/*/settings.env \
    "$root"/scripts/*/settings.env "$root"/trainer/*/settings.env; do
    [[ -f $file ]] && printf '%s\n' "$(<"$file")"  # bash reads it: no cat on a bare PATH, one newline at the end
  done
  return 0
}

# check_settings: exits 2 naming each setting whose value breaks its key's rule (scripts/common/settings.py, the one
# table), before a script pastes any value into a command. Checks the values this shell holds (the environment's, or
# the file's that load_settings set).
check_settings() {
  local key pairs=() root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  while IFS='=' read -r key _; do
    [[ $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    pairs+=("$key=${!key:-}")
  done < <(settings_lines)
  if ! command -v python3 >/dev/null 2>&1; then
    echo "error: python3 is not installed; the scripts check the settings with it (https://www.python.org/downloads/)" >&2
    exit 1
  fi
  (
    for pair in "${pairs[@]}"; do export "${pair?}"; done
    cd "$root" && python3 -B -m scripts.common.settings --check  # -B: no __pycache__ left in the checkout
  ) || exit 2
}

# kube_context: the kubeconfig context the cluster commands use: KUBE_CONTEXT when set, else the project's k3d
# cluster's, never the current context (which another tool may have switched).
kube_context() {
  printf '%s\n' "${KUBE_CONTEXT:-k3d-${CLUSTER_NAME}}"
}

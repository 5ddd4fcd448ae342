# shellcheck shell=bash
# Sourced by the shell scripts: load_settings FILE sets each KEY=VALUE of k8s/base/settings.env as a default;
# a variable that is already set and non-empty (the environment, or make's values) keeps its value.
load_settings() {
  local key value
  while IFS='=' read -r key value; do
    [[ $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    [[ -n ${!key:-} ]] || printf -v "$key" '%s' "$value"
  done <"$1"
}

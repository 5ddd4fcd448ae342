"""What the tool rooms share: settings, the rendered manifests and their overrides, TF_CONFIG, process groups, ports."""

"""Runs a Kubeflow TFJob manifest as local processes, the way the training operator v1.9 would run its pods."""

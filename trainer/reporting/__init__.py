"""Reporting: what a run tells its operator while it runs (the progress line, the status file and endpoint, the
Prometheus metrics, TensorBoard, metrics.json), through one reporter; the TF log filter keeps pod logs readable."""

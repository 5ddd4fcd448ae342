"""Runs an engine's rendered manifest (a TFJob, a JobSet, a TrainJob) as local processes, the way its controller would
run its pods: what every engine shares is here, each engine's part in its folder (k8s/engines/<engine>/local_run.py)."""

"""Joining and leaving the training group: TF_CONFIG, the strategy, preemption."""

"""Artifacts and observability: checkpoints, the saved model, the --model-dir layout, status, progress, reports."""

"""What a run persists: checkpoints, the saved model and its check, the --model-dir layout, the model dir's owner."""

"""make tune: hyperparameter search over the real multi-worker job (Optuna here); a room a fork can delete."""

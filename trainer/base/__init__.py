"""What every room stands on, importing nothing of the trainer: the exit codes and errors, the private TF APIs."""

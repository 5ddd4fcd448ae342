"""What every room stands on, importing nothing of the trainer: the exit codes and errors, the private TF APIs, files
written beside their final name and renamed into place."""

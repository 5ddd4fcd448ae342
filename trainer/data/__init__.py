"""Where the examples come from: datasets, the input pipeline, TFRecord files; `python -m trainer.data` prepares."""

"""The model server and model selection: an optional room, like trainer/ps/.

`python -m trainer.serving` serves a base path of SavedModel versions (a model dir's serving/, or the base path
selection publishes into) on KServe's model server: REST v1 in TensorFlow Serving's format, REST v2 and gRPC v2
(the Open Inference Protocol), health, readiness and /metrics, swapping in a newer version as it appears.
`python -m trainer.serving.select` picks the best of several trained model dirs by the task's objective and
publishes it there under a new version. Nothing outside this room imports it: delete trainer/serving/ (and its
tests, the serve extra and the make targets) and training works as before. docs/serving.md describes both.
"""

"""`python -m late_finisher ARGS` is `python -m trainer ARGS`, except that the worker whose TF_CONFIG task index
is LATE_TASK returns from training LATE_S seconds after the others, as a worker that is slower to finish does."""

import json
import os
import sys
import time

from trainer.reporting import tf_log_filter

tf_log_filter.install()  # as python -m trainer does, before TensorFlow is imported

import trainer.__main__  # noqa: E402  (sets TensorFlow's environment before it is imported)
import trainer.loop  # noqa: E402

_train_and_evaluate = trainer.loop.train_and_evaluate


def _late_train_and_evaluate(*args, **kwargs):
    record = _train_and_evaluate(*args, **kwargs)
    if str(json.loads(os.environ["TF_CONFIG"])["task"]["index"]) == os.environ["LATE_TASK"]:
        time.sleep(float(os.environ["LATE_S"]))
    return record


trainer.loop.train_and_evaluate = _late_train_and_evaluate
sys.exit(trainer.__main__.main())

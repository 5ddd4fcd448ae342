"""Test-only hook: `python -m wrong_loss_scale TRAINER_FLAGS...` runs the trainer with its loss multiplied by
$WRONG_LOSS_SCALE, the bug an accuracy comparison must catch. Never a user flag: it lives with the tests."""

import os
import sys

import tensorflow as tf

from trainer.__main__ import main

_average = tf.nn.compute_average_loss


def _scaled_average(*args, **kwargs):
    return _average(*args, **kwargs) * float(os.environ["WRONG_LOSS_SCALE"])


tf.nn.compute_average_loss = _scaled_average

if __name__ == "__main__":
    sys.exit(main())

"""`python -m trainer`: config -> cluster -> strategy -> train_and_evaluate -> exit code.

Bad flags and a bad TF_CONFIG stop the program here, before TensorFlow starts.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before the heavy imports: time to first step counts them

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

# Before anything imports TensorFlow: Keras 3 on its TF backend, and no INFO chatter from C++ in pod logs.
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from trainer import exit_codes  # noqa: E402
from trainer.cluster import ClusterConfigError, from_environment  # noqa: E402
from trainer.config import ConfigError, parse_config  # noqa: E402

log = logging.getLogger("trainer")


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
        cluster = from_environment()
    except (ConfigError, ClusterConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return exit_codes.BAD_CONFIG
    logging.basicConfig(
        level=logging.INFO if cluster.is_chief or config.verbose_workers else logging.WARNING,
        format=f"%(asctime)s {cluster.name} %(levelname)s %(message)s",
        stream=sys.stdout,
    )
    if cluster.is_evaluator:
        # The evaluator is not part of the all-reduce group; test-split evaluation runs inside the loop.
        log.warning("%s: this trainer evaluates on the test split inside the training loop; an evaluator "
                    "task has nothing to do and exits 0. Remove the Evaluator replica to save a pod.", cluster.name)
        return exit_codes.OK

    from trainer import saving

    if cluster.is_chief:
        try:
            saving.check_model_dir(config.model_dir)
        except saving.ModelDirError as error:
            print(f"error: {error}", file=sys.stderr)
            return exit_codes.BAD_CONFIG

    import tensorflow as tf

    from trainer.data import DataError
    from trainer.strategy import create_strategy
    from trainer.train import train_and_evaluate

    strategy = create_strategy(cluster, config.collective, config.startup_timeout)
    try:
        train_and_evaluate(config, cluster, strategy, STARTED_AT)
    except (ConfigError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return exit_codes.BAD_CONFIG
    except (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError,
            tf.errors.DeadlineExceededError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: {cluster.name} lost contact with the training group ({first_line}). Every worker must "
              f"restart and resume; exiting with retryable code {exit_codes.GROUP_FAILED}.", file=sys.stderr)
        return exit_codes.GROUP_FAILED
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())

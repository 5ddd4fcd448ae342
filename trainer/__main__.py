"""`python -m trainer`: config -> cluster -> strategy -> train_and_evaluate -> exit code.

Bad flags and a bad TF_CONFIG stop the program here, before TensorFlow starts.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before the heavy imports: time to first step counts them

import atexit  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from typing import NoReturn  # noqa: E402

# Before anything imports TensorFlow: Keras 3 on its TF backend, and no INFO chatter from C++ in pod logs.
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from trainer.config import Config, parse_config  # noqa: E402
from trainer.distribution.cluster import from_environment  # noqa: E402
from trainer.errors import (  # noqa: E402
    ExitCode,
    UserError,
    first_line,
)

log = logging.getLogger("trainer")


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
        cluster = from_environment(strategy=config.strategy)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {cluster.name} %(levelname)s %(message)s", stream=sys.stdout
    )
    # INFO for the trainer's own lines on the chief; TensorFlow's Python loggers stay at WARNING.
    log.setLevel(logging.INFO if cluster.is_chief or config.verbose_workers else logging.WARNING)
    # Every worker says what it waits for while the group forms: that is where a stuck start shows.
    logging.getLogger("trainer.distribution.strategy").setLevel(logging.INFO)
    if config.download and cluster.is_distributed:
        print(
            "error: --download in a group of workers would download the same files concurrently. Prepare the "
            "data once with `python -m trainer.data --dataset ... --data-dir ...` (on the cluster, the "
            "data-preparation Job), then start the workers without --download",
            file=sys.stderr,
        )
        return ExitCode.BAD_CONFIG

    from trainer.artifacts import saving
    from trainer.artifacts.status import StatusReporter

    try:
        if cluster.is_chief:
            saving.check_model_dir(config.model_dir)
        status = StatusReporter(config.model_dir, enabled=cluster.is_chief)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    status.update(state="starting", workers=cluster.num_workers)
    try:
        # Bound before the group forms, so a taken port fails fast; it answers once the wait is over.
        status.serve(config.status_host, config.status_port)
    except UserError as error:
        status.update(state="failed", error=str(error))
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG

    from trainer.artifacts.progress import Startup
    from trainer.distribution.strategy import (  # imports TensorFlow: most of the start-up
        create_parameter_server_strategy,
        create_strategy,
        is_group_failure,
        leave_group,
        run_server,
        share_cores,
    )

    startup = Startup(STARTED_AT)
    startup.reached("tensorflow_imported")
    share_cores(config.threads, cluster, overlap=config.gradient_bucket_bytes > 0)  # before any TensorFlow op
    # Raised inside tf.distribute's own dataset iteration on every epoch; nothing a user can act on.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")

    from trainer.distribution.preemption import Preempted

    if cluster.role == "server":
        run_server(cluster, config.startup_timeout)
        return ExitCode.OK
    if cluster.is_evaluator:
        from trainer.ps.evaluator import follow_checkpoints

        # Joins no group and writes only its own files: logs/eval and evaluations.json.
        logging.getLogger("trainer.ps.evaluator").setLevel(logging.INFO)
        try:
            check_inputs_before_the_group_forms(config)
            follow_checkpoints(config, cluster)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            return ExitCode.BAD_CONFIG
        return ExitCode.OK
    try:
        check_inputs_before_the_group_forms(config)
        if cluster.is_async:
            from trainer.ps.train_async import train_async

            strategy, coordinator = create_parameter_server_strategy(cluster, config.startup_timeout)
            startup.reached("group_formed")
            train_async(config, cluster, strategy, coordinator, startup, status)
        else:
            from trainer.train import train_and_evaluate

            strategy = create_strategy(cluster, config.collective, config.startup_timeout)
            startup.reached("group_formed")
            train_and_evaluate(config, cluster, strategy, startup, status)
    except Preempted as stopped:
        log.warning(
            "%s: %s; exiting with retryable code %d to resume after the restart",
            cluster.name,
            stopped,
            ExitCode.PREEMPTED,
        )
        return ExitCode.PREEMPTED
    except UserError as error:
        status.update(state="failed", error=str(error))
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    except BaseException as error:
        if not is_group_failure(error):
            status.update(state="failed", error=f"{type(error).__name__}: {error}")
            raise
        reason = first_line(error)
        status.update(state="failed", error=f"lost a peer, restarting: {reason}")
        print(
            f"error: {cluster.name} lost contact with the training group ({reason}). Every worker must "
            f"restart and resume; exiting with retryable code {ExitCode.GROUP_FAILED}.",
            file=sys.stderr,
        )
        return ExitCode.GROUP_FAILED
    finally:
        status.close()
    if cluster.is_distributed:
        leave_group(cluster, strategy, config.startup_timeout)
    return ExitCode.OK


def check_inputs_before_the_group_forms(config: Config) -> None:
    """Raises the UserError of the first input that cannot work. Run before the group forms, so a typo in a flag
    costs one process start, not a group start-up (and on a cluster, not a wait for every pod)."""
    from trainer import model
    from trainer.data import datasets

    model.check_model_name(config.model)
    datasets.check_dataset(config)


def exit_without_teardown(code: int) -> NoReturn:
    """Ends the process once everything is persisted, skipping the interpreter's teardown of TensorFlow: its C++
    destructors and thread joins took seconds on a busy machine, and after a lost worker the async coordinator's
    RPC threads can abort (SIGABRT) in it. The exit functions (scratch directories, the log filter) still run."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    from trainer.artifacts import tf_log_filter

    # Before TensorFlow is imported: its C++ start-up lines go to fd 2 directly (TRAINER_TF_NOISE=1 keeps them).
    tf_log_filter.install()
    exit_without_teardown(main())

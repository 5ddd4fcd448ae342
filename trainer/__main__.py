"""`python -m trainer`: config -> cluster -> strategy -> the loop -> exit code.

Bad core flags and a bad TF_CONFIG stop the program here, before TensorFlow starts (the task's own options are
read next, with its module). Every way out is decided in one table, ending(): a UserError exits 2 (a module missing
from the image too), a full volume 3, a divergence 4, a SIGTERM 143, a lost group 144, a group that cannot form 137,
success 0; anything else is a bug, with its traceback and exit 1. In a pod, the line each prints is also its
termination message.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before the heavy imports: time to first step counts them

import atexit  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from typing import TYPE_CHECKING, Any, NoReturn  # noqa: E402

# Before anything imports TensorFlow: Keras 3 on its TF backend, and no INFO chatter from C++ in pod logs.
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from trainer.artifacts.layout import ModelDir  # noqa: E402
from trainer.base.errors import (  # noqa: E402
    ClusterConfigError,
    ConfigError,
    Diverged,
    ExitCode,
    StartupTimeout,
    UserError,
    missing_module,
    volume_full,
)
from trainer.context import RunContext, read_core, run_context  # noqa: E402
from trainer.data import catalog, tfds, tfrecord  # noqa: E402
from trainer.distribution.cluster import Cluster, from_environment  # noqa: E402
from trainer.distribution.preemption import Preempted  # noqa: E402
from trainer.reporting import termination_message  # noqa: E402
from trainer.settings.config import Config  # noqa: E402

if TYPE_CHECKING:
    from trainer.data.inputs import Inputs
    from trainer.reporting.report import Reporter

log = logging.getLogger("trainer")


@dataclasses.dataclass(frozen=True)
class Ending:
    """How the run ends for one kind of failure: its exit code, the one line it prints (as a log warning where the
    ending is a restart the operator expects, else on stderr), and what the status says (status None: the status
    keeps what the run last reported)."""

    code: int
    line: str
    status: str | None = None
    state: str = "failed"
    warning: bool = False


def ending(error: BaseException, model_dir: str, cluster: Cluster | None) -> Ending | None:
    """The exit table: each failure the trainer knows, with its code, its line and its status. None for anything
    else, a bug: its traceback and exit code 1. cluster: None while TF_CONFIG is not read yet."""
    if isinstance(error, Preempted):  # a checkpoint was saved: restart and resume
        name = cluster.name if cluster else "trainer"
        line = f"{name}: {error}; exiting with retryable code {ExitCode.PREEMPTED} to resume after the restart"
        return Ending(ExitCode.PREEMPTED, line, warning=True)
    if isinstance(error, Diverged):
        return Ending(ExitCode.DIVERGED, f"error: {error}", str(error), state="diverged")
    user_error = error if isinstance(error, UserError) else missing_module(error)
    if user_error is not None:
        return Ending(ExitCode.BAD_CONFIG, f"error: {user_error}", str(user_error))
    full = volume_full(error, model_dir)
    if full is not None:  # one line, not a traceback: the operator's fix is in it (the status write may fail too)
        return Ending(ExitCode.VOLUME_FULL, f"error: {full}", str(full))
    if isinstance(error, StartupTimeout):
        return Ending(ExitCode.STARTUP_TIMEOUT, f"error: {error}", str(error))
    if cluster is not None and lost_group(error):
        from trainer.distribution.strategy import lost_group_message

        message = lost_group_message(error, cluster)
        return Ending(ExitCode.GROUP_FAILED, f"error: {message}", f"lost a peer, restarting: {message}")
    return None


def lost_group(error: BaseException) -> bool:
    """Whether the group broke up; only TensorFlow reports that, so a run that never imported it has not."""
    if "tensorflow" not in sys.modules:
        return False
    from trainer.distribution.strategy import is_group_failure

    return is_group_failure(error)


def main(argv: list[str] | None = None) -> int:
    """Every way out, decided here: run() returns only on success, and each failure ends as ending() says."""
    reporter, model_dir, cluster = None, ".", None
    try:
        core = read_core(argv)
        model_dir = core.config.model_dir
        cluster = from_environment(strategy=core.config.strategy)
        layout = ModelDir(model_dir)  # the one ModelDir of the run, handed down in its context
        reporter = reporter_for(core.config, cluster, layout)
        reporter.starting(cluster.num_workers, core.config.status_host, core.config.status_port)  # a taken port: exit 2
        run(run_context(core, cluster, layout), reporter)  # with the task's options: imports its module, TensorFlow
        return ExitCode.OK
    except BaseException as error:
        end = ending(error, model_dir, cluster)
        if end is None:
            if isinstance(error, Exception):  # not Ctrl-C or sys.exit
                termination_message.write(f"error: {type(error).__name__}: {error}")
            if reporter is not None:
                reporter.failed(f"{type(error).__name__}: {error}", 1)  # the traceback's exit code: permanent
            raise
        termination_message.write(end.line)
        if reporter is not None and end.status is not None:
            reporter.failed(end.status, end.code, state=end.state)
        if end.warning:
            log.warning(end.line)
        else:
            print(end.line, file=sys.stderr)
        return end.code
    finally:
        if reporter is not None:
            reporter.close()


def reporter_for(core: Config, cluster: Cluster, model_dir: ModelDir) -> Reporter:
    """Logging for this task, the model dir claimed (the chief's), and the run's reporter."""
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {cluster.name} %(levelname)s %(message)s", stream=sys.stdout
    )
    # INFO for the trainer's own lines on the chief; TensorFlow's Python loggers stay at WARNING.
    log.setLevel(logging.INFO if cluster.is_chief or core.verbose_workers else logging.WARNING)
    # Every task says what it waits for while the group forms (and what it serves): that is where a stuck start shows.
    for joining in ("trainer.distribution.strategy", "trainer.ps.strategy"):
        logging.getLogger(joining).setLevel(logging.INFO)
    if core.group(tfds.TfdsOptions).download and cluster.is_distributed:
        raise ConfigError(
            "--download in a group of workers would download the same files concurrently. Prepare the "
            "data once with `python -m trainer.data --dataset ... --data-dir ...` (on the cluster, the "
            "data-preparation Job), then start the workers without --download"
        )

    from trainer.artifacts import ownership, saving
    from trainer.reporting.report import Reporter

    if cluster.is_chief:
        saving.check_model_dir(model_dir.root)
        ownership.claim(model_dir)  # another job's directory: exit 2 before anything is written
    return Reporter(model_dir, cluster.name, cluster.is_chief, core.verbose_workers, evaluator=cluster.is_evaluator)


def run(context: RunContext, reporter: Reporter) -> None:
    """The run of this task, from its settings to its last step; raises what main() turns into an exit code."""
    config, cluster = context.config, context.cluster

    from trainer.distribution.strategy import create_strategy, leave_group, share_cores
    from trainer.reporting.progress import Startup

    startup = Startup(STARTED_AT)
    startup.reached("tensorflow_imported")
    share_cores(config.threads, cluster, overlap=config.gradient_bucket_bytes > 0)  # before any TensorFlow op
    # Raised inside tf.distribute's own dataset iteration on every epoch; nothing a user can act on.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")

    from trainer import loop
    from trainer.distribution.sync_runner import SyncRunner

    check_inputs_before_the_group_forms(config, cluster)
    if cluster.is_evaluator:
        from trainer import evaluator

        # Joins no group and writes only its own files: logs/eval and evaluations.json.
        logging.getLogger("trainer.evaluator").setLevel(logging.INFO)
        evaluator.follow_checkpoints(context, open_inputs(config, cluster), reporter=reporter)
        return
    if cluster.role == "server" or cluster.is_async:
        ps = _parameter_server_room(cluster)
    if cluster.role == "server":
        ps.strategy.run_server(cluster, config.startup_timeout)
        return
    if cluster.is_async:
        strategy, coordinator = ps.strategy.create_parameter_server_strategy(cluster, config.startup_timeout)
        startup.reached("group_formed")
        runner = functools.partial(ps.async_runner.AsyncRunner, coordinator=coordinator)
        inputs = open_inputs(config, cluster)
        loop.train_and_evaluate(context, strategy, inputs, runner, startup, reporter)
    else:
        strategy = create_strategy(cluster, config.collective, config.startup_timeout)
        startup.reached("group_formed")
        inputs = open_inputs(config, cluster, strategy)
        loop.train_and_evaluate(context, strategy, inputs, SyncRunner, startup, reporter)
    if cluster.is_distributed:
        leave_group(cluster, strategy, config.startup_timeout)


def set_precision_and_seed(config: Config) -> None:
    """The run's dtype policy (before any model is built: its layers take it) and its seed, for every role."""
    import keras

    keras.mixed_precision.set_global_policy(config.precision)
    keras.utils.set_random_seed(config.seed)


def open_inputs(config: Config, cluster: Cluster, strategy: Any = None) -> Inputs:
    """This process's data, opened once, after its precision and seed are set (once the group formed: seeding
    starts TensorFlow's runtime): an all-reduce worker's shard, its sizes agreed over the group through the
    strategy; the whole of both splits for the async chief and the evaluator (strategy None)."""
    from trainer.data.inputs import open_inputs as open_data

    set_precision_and_seed(config)

    if strategy is None:
        return open_data(config, 0, 1, cluster.name)
    from trainer.distribution.collectives import gather_over_workers

    rank, workers = cluster.rank, cluster.num_workers
    gather = functools.partial(gather_over_workers, strategy, rank, workers)
    return open_data(config, rank, workers, cluster.name, gather)


def _parameter_server_room(cluster: Cluster) -> Any:
    """trainer.ps (the parameter-server mode), imported only for the roles that need it: this trainer's own
    (an installed copy of the package elsewhere must not stand in for a deleted room)."""
    spec = importlib.util.find_spec("trainer.ps")
    if spec is None or spec.origin is None or pathlib.Path(spec.origin).parent.parent != pathlib.Path(__file__).parent:
        raise ClusterConfigError(
            f"TF_CONFIG makes this task {cluster.name}, a role of the parameter-server mode, but "
            f"this trainer has no trainer/ps package (the optional parameter-server mode was deleted); restore "
            f"trainer/ps or run all-reduce workers only"
        )
    import trainer.ps.async_runner
    import trainer.ps.strategy

    return trainer.ps


def check_inputs_before_the_group_forms(config: Config, cluster: Cluster) -> None:
    """Raises the UserError of the first input that cannot work. Run before the group forms, so a typo in a flag
    costs one process start, not a group start-up (and on a cluster, not a wait for every pod). The task's options
    were checked as they were parsed."""
    if cluster.is_async and (config.gradient_compression != "none" or config.gradient_bucket_bytes):
        raise ConfigError(
            "--gradient-compression and --gradient-bucket-bytes shape the all-reduce of sync training; under "
            "parameter servers each worker sends its gradients to the ps tasks as they are: drop both flags"
        )
    if cluster.is_async and config.group(tfrecord.RecordOptions).on_corrupt_record == "skip":
        raise ConfigError(
            "--on-corrupt-record skip counts what each worker's input drops, which parameter-server workers cannot "
            "report back: fix the files (the error names them), or train with all-reduce workers"
        )
    catalog.check_dataset(config)


def exit_without_teardown(code: int) -> NoReturn:
    """Ends the process once everything is persisted, skipping the interpreter's teardown of TensorFlow: its C++
    destructors and thread joins took seconds on a busy machine, and after a lost worker the async coordinator's
    RPC threads can abort (SIGABRT) in it. The exit functions (scratch directories, the log filter) still run."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    from trainer.reporting import tf_log_filter

    # Before TensorFlow is imported: its C++ start-up lines go to fd 2 directly (TRAINER_TF_NOISE=1 keeps them).
    tf_log_filter.install()
    exit_without_teardown(main())

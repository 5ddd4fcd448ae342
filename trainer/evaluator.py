"""The evaluator task (both strategies): follows the chief's checkpoints and evaluates each on the test split.

It trains nothing and joins no group: it polls <model-dir>/checkpoints (the shared volume), restores each new
checkpoint into its own copy of the model, evaluates the whole test split, and tells the run's reporter
(trainer/reporting/report.py), which writes the result to TensorBoard (logs/eval) and to evaluations.json. It knows
the last checkpoint from the chief's status.json, which names the run's total_steps: the chief always saves at the
last step, so the checkpoint numbered total_steps is the final one, and the evaluator exits 0 after evaluating it.
A checkpoint deleted (max_to_keep) before its turn is skipped; one that cannot be read yet (still being written) is
tried again at the next poll.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import tensorflow as tf

from trainer.artifacts.checkpoint import checkpoint_prefixes, checkpoint_step
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import DataError, first_line
from trainer.context import RunContext
from trainer.data import pipeline
from trainer.data.inputs import Inputs
from trainer.reporting.report import Reporter
from trainer.reporting.status import read_status
from trainer.step import Totals, metric_names, test_totals

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
TEST_BATCH_SIZE = 256


def follow_checkpoints(
    context: RunContext, inputs: Inputs, poll_seconds: float = POLL_SECONDS, reporter: Reporter | None = None
) -> list[dict[str, Any]]:
    """Evaluates every checkpoint the chief writes until the final one, on the whole test split of inputs (opened
    as 0 of 1); returns the evaluations."""
    config, task, cluster, layout = context.config, context.task, context.cluster, context.model_dir
    reporter = reporter or Reporter(layout, cluster.name, is_chief=False, evaluator=True)
    test_size = inputs.test_size
    if not test_size:
        raise DataError(
            f"the test split of --dataset {config.dataset} has no examples, so the evaluator has nothing to evaluate; "
            f"point --test-files at files with examples (or leave out the evaluator task)"
        )
    model = task.build_model(inputs.source)
    checkpoint = tf.train.Checkpoint(model=model)
    test_batches = pipeline.test_batches(inputs.test, TEST_BATCH_SIZE, test_size)
    evaluate = tf.function(lambda: test_totals(task, model, test_batches))
    names = metric_names(task)
    log.info(
        "%s: evaluator following the checkpoints in %s (written by the chief %s); %d test examples",
        cluster.name,
        layout.checkpoints,
        cluster.chief_address,
        test_size,
    )

    done: set[int] = set()
    while True:
        final_step = _final_step(layout, config.epochs)
        for prefix in reversed(checkpoint_prefixes(layout.checkpoints)):
            step = checkpoint_step(prefix)
            if step in done:
                continue
            try:
                checkpoint.restore(prefix).expect_partial()
            except (tf.errors.OpError, ValueError) as error:
                log.info("checkpoint %s is not readable yet (%s); trying again", prefix, first_line(error)[:200])
                break
            done.add(step)
            reporter.evaluated(step, Totals(names, evaluate().numpy()))
        if final_step is not None and final_step in done:
            print(f"{cluster.name} evaluated the final checkpoint (step {final_step}); exiting", flush=True)
            return reporter.evaluations
        time.sleep(poll_seconds)


def _final_step(layout: ModelDir, epochs: int) -> int | None:
    """The run's last step, once the chief has announced it in status.json. A status for another number of epochs is
    a previous run's, left in a reused model dir before this run's chief has written its own: not this run's end."""
    try:
        status = read_status(layout.status)
    except (OSError, ValueError):
        return None
    total = status.get("total_steps")
    return total if isinstance(total, int) and status.get("epochs") == epochs else None

"""Saving the trained model: every worker takes part, only the chief's copy is kept.

Saving reads distributed variables, which can need every worker, so all workers
save; the chief writes into --model-dir and the others into a temporary
directory outside it that they delete. Each artifact is written beside its final
name and renamed into place, so a reader never sees a half-written model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import keras

from trainer.artifacts import export_check
from trainer.artifacts.layout import ModelDir
from trainer.base.atomic_file import replaced_on_success
from trainer.base.errors import ModelDirError
from trainer.task import Task

log = logging.getLogger(__name__)


def check_model_dir(model_dir: str) -> None:
    """Fails early, before training, if the chief could not write its artifacts."""
    try:
        os.makedirs(model_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write-check-"):
            pass
    except OSError as error:
        raise ModelDirError(
            f"--model-dir {model_dir} is not writable ({error.strerror}); "
            f"point it at a writable directory (on the cluster: the mounted volume)"
        ) from None


@contextlib.contextmanager
def save_target(model_dir: ModelDir, is_chief: bool) -> Iterator[ModelDir]:
    """The directory this worker saves into: model_dir on the chief, a throw-away one elsewhere."""
    if is_chief:
        os.makedirs(model_dir.root, exist_ok=True)
        yield model_dir
        return
    scratch = tempfile.mkdtemp(prefix="trainer-worker-save-")
    try:
        yield ModelDir(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def save_model(
    model: keras.Model, task: Task, model_dir: ModelDir, is_chief: bool, version: int, features: Any = None
) -> dict[str, Any] | None:
    """Writes the SavedModel serving/<version>/ (signature `serve`: the task's serving function, and the task's
    serving_endpoints), verified on
    `features` (a batch of test features) before it is published, then model.keras. Returns the chief's export
    check for metrics.json (None elsewhere); raises ExportCheckError, with nothing published, on a serving skew."""
    # Every worker computes the reference at the same point: reading the model may read distributed variables.
    expected = None if features is None else export_check.reference(task, model, features)
    with save_target(model_dir, is_chief) as target:
        verify = None
        if is_chief and expected is not None:  # only where it is published; loading back is local, no collective

            def verify(written: str) -> dict[str, Any]:
                return export_check.check(written, task, model, features, expected)

        checked = _write_saved_model(model, task, target.saved_model(version), verify)
        _write_keras(model, target.keras_model)
    if is_chief and checked is None:
        log.warning("the export was not checked: this process has no test examples to run it on")
    return checked


def _write_keras(model: keras.Model, path: str) -> None:
    with replaced_on_success(path) as partial:
        model.save(partial)


def _write_saved_model(
    model: keras.Model, task: Task, path: str, verify: Callable[[str], dict[str, Any]] | None
) -> dict[str, Any] | None:
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        fn=lambda *features: task.serve(model, *features),
        input_signature=task.serving_signature(model),
    )
    for name, (function, input_signature) in task.serving_endpoints(model).items():
        archive.add_endpoint(name=name, fn=function, input_signature=input_signature)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with replaced_on_success(path) as partial:
        archive.write_out(partial, verbose=False)
        return verify(partial) if verify else None  # before the rename: a failed check publishes nothing

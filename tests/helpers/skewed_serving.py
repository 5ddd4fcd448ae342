"""A task whose serving function preprocesses differently from training (it inverts the images first): the model
trains and evaluates normally, and only the exported signature is wrong. `--task-module skewed_serving --task
skewed_serving`; the export check must refuse to publish it."""

from __future__ import annotations

import tensorflow as tf

from trainer.task import register
from trainer.tasks.image_classification import ImageClassification


@register("skewed_serving")
class SkewedServing(ImageClassification):
    def serve(self, model, images):
        return super().serve(model, 255 - images)  # a preprocessing step that only the serving path has


@register("faithful_serving")
class FaithfulServing(ImageClassification):
    """The same task with serve() left as it is but the reference through serve() (the Task default)."""

    def serving_reference(self, model, images):
        return self.serve(model, tf.convert_to_tensor(images))

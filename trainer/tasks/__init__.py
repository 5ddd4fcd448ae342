"""The built-in tasks; importing this package registers them (trainer/context.py and trainer/serving/select.py do)."""

from trainer.tasks import image_classification  # noqa: F401 (registers the default task)

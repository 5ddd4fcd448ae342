"""The built-in tasks; importing this package registers them (trainer.task.find does)."""

from trainer.tasks import image_classification  # noqa: F401 (registers the default task)

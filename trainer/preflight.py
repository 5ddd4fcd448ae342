"""Checks of the user's input that need no training group: run before the group forms, so a typo in a flag
costs one process start, not a group start-up (and on a cluster, not a wait for every pod)."""

from __future__ import annotations

from trainer import datasets, model
from trainer.config import Config


def check_inputs_before_the_group_forms(config: Config) -> None:
    """Raises the UserError of the first input that cannot work; called by `__main__` before create_strategy."""
    model.check_model_name(config.model)
    datasets.check_dataset(config)

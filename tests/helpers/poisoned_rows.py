"""A test dataset: rows of 8 float features and a float target, held as datasets.Arrays, one training row of which
can carry a NaN (or Inf) feature: `--dataset-module poisoned_rows --dataset poisoned_rows --poisoned-row 100`. With
examples/regression.py's task it is the poisoned CSV of docs/trainer.md's non-finite guard, without the file."""

from __future__ import annotations

import dataclasses

import numpy as np

from trainer.data import datasets
from trainer.settings.config import Config
from trainer.settings.options import option

FEATURES = 8


@dataclasses.dataclass(frozen=True)
class PoisonOptions:
    poisoned_row: int = option(-1, "the training row whose first feature is poisoned (-1: none)")
    poison: str = option("nan", "what the row holds: nan or inf", ("nan", "inf"))


def rows(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = rng.uniform(-1, 1, (count, FEATURES)).astype(np.float32)
    return features, (features @ rng.normal(size=FEATURES)).astype(np.float32)


@datasets.register("poisoned_rows", options=PoisonOptions)
def poisoned_rows(config: Config) -> datasets.Source:
    options = config.group(PoisonOptions)
    train_x, train_y = rows(config.train_examples or 512, 1)
    if options.poisoned_row >= 0:
        train_x[options.poisoned_row, 0] = np.nan if options.poison == "nan" else np.inf
    test_x, test_y = rows(config.test_examples or 128, 2)
    return datasets.Source(
        train=datasets.Arrays(train_x, train_y),
        test=datasets.Arrays(test_x, test_y),
        element_spec=datasets.arrays_spec(train_x, train_y),
    )

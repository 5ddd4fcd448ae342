"""Small TFRecord datasets written by the project's own `python -m trainer.data.records`, for tests that read files."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from multiworker import ROOT, trainer_flags


def write_records(
    out: pathlib.Path, train_examples: int, train_shards: int, test_examples: int, test_shards: int, seed: int
) -> list[str]:
    """Writes train-* and test-* shards of the synthetic task into `out`; returns the trainer flags that read them."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.data.records",
            *trainer_flags(
                out=out,
                train_examples=train_examples,
                train_shards=train_shards,
                test_examples=test_examples,
                test_shards=test_shards,
                seed=seed,
            ),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return record_flags(out)


def record_flags(out: pathlib.Path) -> list[str]:
    """The trainer flags that read the train-* and test-* shards in `out`."""
    return ["--train-files", str(out / "train-*"), "--test-files", str(out / "test-*")]

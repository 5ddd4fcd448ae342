"""A model dir on a volume that fills up mid-checkpoint: one line naming the path, the bytes free and the fix, exit 3
(permanent: a restart cannot free space), and the earlier checkpoints intact. The volume is a small tmpfs (root)."""

import json
import os
import subprocess

import pytest
import tensorflow as tf

from multiworker import start, trainer_flags, wait_all
from trainer.artifacts.checkpoint import checkpoint_prefixes
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import ExitCode


@pytest.fixture
def small_volume(tmp_path):
    """A 3 MiB tmpfs: room for two of the CNN's checkpoints (1.1 MB each with the optimizer's slots), not three."""
    volume = tmp_path / "volume"
    volume.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(volume)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield volume
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=True)


def test_a_volume_that_fills_up_mid_checkpoint_is_named_in_one_line_and_exits_permanent(small_volume):
    model_dir = small_volume / "model"
    flags = trainer_flags(dataset="synthetic", train_examples=2048, test_examples=256, epochs=1, threads=1)
    flags += trainer_flags(checkpoint_every=4, keep_checkpoints=100, log_every=4, steps_per_loop=4)
    result = wait_all({"single": start([*flags, "--model-dir", str(model_dir)], None)}, timeout=300)["single"]
    assert result.returncode == ExitCode.VOLUME_FULL == 3, result.output[-3000:]
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output[-3000:]
    assert f"the volume holding {model_dir} is full (" in errors[0]
    assert f"bytes free) while writing {model_dir}/checkpoints/ckpt-" in errors[0]
    assert "earlier checkpoints are intact" in errors[0] and "larger volume" in errors[0]
    assert "Traceback" not in result.output and "ResourceExhaustedError" not in result.output
    kept = checkpoint_prefixes(ModelDir(str(model_dir)).checkpoints)
    assert kept, os.listdir(model_dir)
    assert not [name for name in os.listdir(model_dir / "checkpoints") if "_temp" in name]  # the partial write is gone
    for prefix in kept:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)  # every tensor of every checkpoint left reads back
    status = json.loads((model_dir / "status.json").read_text())
    assert status.get("exit_code", ExitCode.VOLUME_FULL) == ExitCode.VOLUME_FULL  # recorded if there was room

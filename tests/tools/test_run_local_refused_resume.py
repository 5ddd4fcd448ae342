"""The local runner meeting another setup's checkpoints on its volume: the trainer refuses them (exit 2), and the
runner adds the make-level fix and does not present what is on the volume as this run's model."""

import pytest

from local_runner import start_runner

RUN = ["--train-examples", "512", "--test-examples", "64", "--checkpoint-every", "4", "--threads", "1"]
RUNNER = ["--workers", "2", "--dataset", "synthetic", "--epochs", "1"]


@pytest.mark.slow
def test_a_volume_with_another_setups_checkpoints_gets_the_make_level_fix(tmp_path):
    first = start_runner(tmp_path / "job", tmp_path / "scratch1", RUNNER, [*RUN, "--per-worker-batch-size", "32"])
    output, _ = first.communicate(timeout=600)
    assert first.returncode == 0, output[-3000:]
    second = start_runner(tmp_path / "job", tmp_path / "scratch2", RUNNER, [*RUN, "--per-worker-batch-size", "16"])
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 1, output[-3000:]
    assert "global_batch_size: checkpoint has 64, this run has 32" in output
    lines = output.splitlines()
    assert any("holds checkpoints of another setup" in line and "CLEAN=1" in line for line in lines), output[-3000:]
    assert "JOB_NAME" in output
    final = [line for line in lines if "model:" in line][-1]
    assert "this run made none" in final and "holds an earlier run's" in final, final

"""The command line: every flag documented, settable from the environment, and bad values refused."""

import dataclasses
import subprocess
import sys

import pytest

from multiworker import ROOT
from trainer.config import Config, build_parser, parse_config
from trainer.errors import ConfigError


def test_help_documents_every_flag_with_its_default_and_variable():
    text = " ".join(build_parser({}).format_help().split())
    for field in dataclasses.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        assert flag in text, flag
        assert "TRAINER_" + field.name.upper() in text
    assert "(default: 64)" in text


def test_flag_beats_environment_beats_default():
    assert parse_config([], {}).per_worker_batch_size == 64
    assert parse_config([], {"TRAINER_PER_WORKER_BATCH_SIZE": "128"}).per_worker_batch_size == 128
    assert (
        parse_config(["--per-worker-batch-size", "32"], {"TRAINER_PER_WORKER_BATCH_SIZE": "128"}).per_worker_batch_size
        == 32
    )


def test_boolean_flags_from_environment():
    assert parse_config([], {"TRAINER_SCALE_LEARNING_RATE": "true"}).scale_learning_rate is True
    assert parse_config(["--no-scale-learning-rate"], {"TRAINER_SCALE_LEARNING_RATE": "1"}).scale_learning_rate is False
    with pytest.raises(ConfigError, match="TRAINER_DOWNLOAD: expected true/false"):
        parse_config([], {"TRAINER_DOWNLOAD": "maybe"})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--per-worker-batch-size", "-4"], "--per-worker-batch-size must be at least 1"),
        (["--learning-rate", "0"], "--learning-rate must be positive"),
        (["--train-examples", "-1"], "--train-examples must be 0"),
        (["--status-port", "70000"], "--status-port must be a TCP port"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints must be at least 1"),
    ],
)
def test_bad_values_are_refused_with_the_flag_named(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, {})


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="TRAINER_EPOCHS: expected a int"):
        parse_config([], {"TRAINER_EPOCHS": "three"})


def test_log_interval_is_a_whole_number_of_calls():
    assert parse_config(["--log-every", "100", "--steps-per-loop", "16"], {}).effective_log_every == 112
    assert parse_config(["--log-every", "5", "--steps-per-loop", "16"], {}).effective_log_every == 16


def run_trainer(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


def test_cli_bad_choice_exits_2_with_choices():
    result = run_trainer("--cache", "fast")
    assert result.returncode == 2
    assert "invalid choice: 'fast'" in result.stderr and "memory" in result.stderr


def test_cli_bad_value_exits_2():
    result = run_trainer("--epochs", "0")
    assert result.returncode == 2 and "--epochs must be at least 1" in result.stderr


def test_cli_unwritable_model_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_trainer("--dataset", "synthetic", "--model-dir", str(blocker / "model"))
    assert result.returncode == 2
    assert "--model-dir" in result.stderr and "not writable" in result.stderr


def test_an_empty_variable_means_the_default_as_settings_env_leaves_the_data_settings():
    # Before, TRAINER_NUM_CLASSES= stopped every pod with "expected a int", and TRAINER_IMAGE_FEATURE= read no image.
    empty = {"TRAINER_NUM_CLASSES": "", "TRAINER_IMAGE_FEATURE": "", "TRAINER_TRAIN_FILES": ""}
    config = parse_config([], environ=empty)
    assert (config.num_classes, config.image_feature, config.train_files) == (0, "image", "")

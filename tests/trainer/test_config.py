"""The command line: every flag documented, settable from the environment, and bad values refused."""

import dataclasses
import os
import pathlib

import pytest

from multiworker import ROOT
from python_module import run_module
from trainer.base.errors import ConfigError
from trainer.context import parse_config, read_core
from trainer.data import catalog
from trainer.data.tfds import TfdsOptions
from trainer.data.tfrecord import RecordOptions
from trainer.settings.config import Config
from trainer.settings.flags import build_parser
from trainer.settings.options import option, option_fields
from trainer.tasks.image_classification import ImageClassificationOptions


def test_help_documents_every_flag_with_its_default_and_variable():
    groups = [*catalog.option_groups(), ("task image_classification", ImageClassificationOptions)]
    text = " ".join(build_parser({}, groups).format_help().split())
    for options in (Config, ImageClassificationOptions, RecordOptions, TfdsOptions):
        for field in option_fields(options):
            flag = "--" + field.name.replace("_", "-")
            shown = not field.metadata.get("hidden")  # an older name that keeps working, out of --help
            assert (flag in text) == shown, flag
            assert ("TRAINER_" + field.name.upper() in text) == shown
    assert "(default: 64)" in text and "task image_classification:" in text


def test_the_tasks_options_are_flags_and_variables_with_the_same_precedence():
    options = parse_config([], {}).group(ImageClassificationOptions)
    assert (options.model, options.dense_units) == ("cnn", 64)
    from_env = parse_config([], {"TRAINER_MODEL": "dropout", "TRAINER_DENSE_UNITS": "32"})
    assert from_env.group(ImageClassificationOptions).dense_units == 32
    flag_wins = parse_config(["--dense-units", "16"], {"TRAINER_DENSE_UNITS": "32"})
    assert flag_wins.group(ImageClassificationOptions).dense_units == 16
    assert flag_wins.to_dict()["model"] == "cnn" and flag_wins.to_dict()["dense_units"] == 16
    with pytest.raises(ConfigError, match="TRAINER_DENSE_UNITS: expected int"):
        parse_config([], {"TRAINER_DENSE_UNITS": "wide"})


def test_cli_help_lists_the_default_tasks_options():
    result = run_trainer("--help")
    assert result.returncode == 0
    assert "--model" in result.stdout and "TRAINER_DENSE_UNITS" in result.stdout and "--module" in result.stdout
    assert "--task-module" not in result.stdout  # the older name works, out of --help


def test_an_unknown_task_names_the_choices_and_the_way_to_add_one():
    with pytest.raises(ConfigError, match="unknown task 'translation'; choose one of image_classification"):
        parse_config(["--task", "translation"], {})
    with pytest.raises(ConfigError, match="--task-module no_such_module: cannot import it"):
        parse_config(["--task-module", "no_such_module"], {})


@dataclasses.dataclass(frozen=True)
class Typed:
    count: int = option(1, "an int, annotated as the string 'int' under postponed annotations")
    rate: float = option(0.5, "a float")
    on: bool = option(False, "a bool")


@dataclasses.dataclass(frozen=True)
class WithAList:
    names: list[str] = option((), "a list: no flag or variable can carry it")


@dataclasses.dataclass(frozen=True)
class WithAnOptional:
    limit: int | None = option(None, "an optional int")


def test_option_values_are_parsed_by_their_real_types():
    # Before, types were compared as strings ("int", "bool"): any other spelling of a type parsed as a str.
    environ = {"TRAINER_COUNT": "3", "TRAINER_RATE": "0.25", "TRAINER_ON": "yes"}
    args = build_parser(environ, [("typed", Typed)]).parse_args([])
    assert (args.count, args.rate, args.on) == (3, 0.25, True)


@pytest.mark.parametrize("options", [WithAList, WithAnOptional])
def test_an_option_of_a_type_flags_cannot_carry_is_refused_when_the_parser_is_built(options):
    # Before, a list or optional field silently arrived as a string.
    with pytest.raises(TypeError, match=f"option {options.__qualname__}\\.\\w+ has type"):
        build_parser({}, [("bad", options)])


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
        # The task's own options, bounded where they are declared.
        (["--dense-units", "0"], "--dense-units must be at least 1"),
        (["--conv-dropout", "1"], r"--conv-dropout must be in \[0, 1\), got 1.0"),
        (["--dense-dropout", "-0.5"], r"--dense-dropout must be in \[0, 1\)"),
    ],
)
def test_bad_values_are_refused_with_the_flag_named(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, {})


def test_a_bound_holds_a_variable_too():
    with pytest.raises(ConfigError, match="--steps-per-loop must be at least 1, got 0"):
        parse_config([], {"TRAINER_STEPS_PER_LOOP": "0"})


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="TRAINER_EPOCHS: expected int"):
        parse_config([], {"TRAINER_EPOCHS": "three"})


def test_a_misspelt_variable_is_refused_naming_the_setting_it_was_meant_for():
    # Before, each was ignored: the run went on with the default batch size and class count.
    with pytest.raises(ConfigError) as refused:
        parse_config([], {"TRAINER_PER_WORKER_BATCH": "64", "TRAINER_NUM_CLASES": "3", "TRAINER_XYZZY": "1"})
    message = str(refused.value)
    assert "TRAINER_NUM_CLASES (did you mean TRAINER_NUM_CLASSES?)" in message
    assert "TRAINER_PER_WORKER_BATCH (did you mean TRAINER_PER_WORKER_BATCH_SIZE?)" in message
    assert "TRAINER_XYZZY: " in message and "k8s/base/trainer.env" in message


def test_a_forks_option_without_its_module_is_refused_naming_the_module():
    # docs/fork.md's TRAINER_HIDDEN_UNITS=64 without TRAINER_MODULE: a fresh process never imports the module.
    alone = run_module(
        "trainer", "--dataset", "synthetic", env={**os.environ, "TRAINER_HIDDEN_UNITS": "8"}, timeout=120
    )
    assert alone.returncode == 2
    assert "TRAINER_HIDDEN_UNITS: no option of this run" in alone.stderr  # no far-fetched "did you mean"
    assert "needs --module, TRAINER_MODULE" in alone.stderr


def test_an_option_of_a_registered_task_the_run_did_not_choose_is_named_as_such(monkeypatch):
    from trainer import task

    class Other(task.Task):
        @dataclasses.dataclass(frozen=True)
        class Options:
            depth: int = option(3, "layers")

    monkeypatch.setitem(task.TASKS, "other", Other)
    with pytest.raises(ConfigError, match=r"TRAINER_DEPTH \(an option of task other, which this run does not use\)"):
        parse_config([], {"TRAINER_DEPTH": "4"})
    # Chosen, its options are the run's: the variable is read, not refused.
    assert [group.depth for group in parse_config(["--task", "other"], {"TRAINER_DEPTH": "4"}).groups[-1:]] == [4]


def test_help_still_prints_beside_a_misspelt_variable():
    result = run_module("trainer", "--help", env={**os.environ, "TRAINER_NUM_CLASES": "3"}, timeout=120)
    assert result.returncode == 0 and "TRAINER_NUM_CLASSES" in result.stdout


def test_the_data_job_refuses_a_misspelt_variable_as_the_trainer_does():
    # Before, python -m trainer.data ignored it: TRAINER_DATA_DIRR=... prepared the data in the default directory.
    result = run_module(
        "trainer.data", "--dataset", "synthetic", env={**os.environ, "TRAINER_DATA_DIRR": "x"}, timeout=120
    )
    assert result.returncode == 2
    assert "TRAINER_DATA_DIRR (did you mean TRAINER_DATA_DIR?)" in result.stderr
    # Every registered task's options are the data Job's: it runs beside whichever task the job trains.
    every_task = {**os.environ, "TRAINER_DENSE_UNITS": "64"}
    assert run_module("trainer.data", "--dataset", "synthetic", env=every_task, timeout=120).returncode == 0


def test_what_kubernetes_and_the_log_filter_put_in_the_environment_is_not_refused():
    # What the kubelet gave a pod beside JOB_NAME=trainer's status Service (read on the local node); its
    # TRAINER_STATUS_PORT (tcp://...) is an option too: in the job's pods the ConfigMap's value wins over it.
    service_links = {
        "TRAINER_STATUS_SERVICE_HOST": "10.43.0.10",
        "TRAINER_STATUS_SERVICE_PORT": "8080",
        "TRAINER_STATUS_SERVICE_PORT_STATUS": "8080",
        "TRAINER_STATUS_PORT_8080_TCP": "tcp://10.43.0.10:8080",
        "TRAINER_STATUS_PORT_8080_TCP_ADDR": "10.43.0.10",
        "TRAINER_STATUS_PORT_8080_TCP_PORT": "8080",
        "TRAINER_STATUS_PORT_8080_TCP_PROTO": "tcp",
    }
    parse_config([], {**service_links, "TRAINER_STATUS_PORT": "8080", "TRAINER_TF_NOISE": "1", "TRAINER_TYPO": ""})
    with pytest.raises(ConfigError, match="TRAINER_STATUS_PORT_8080_TCP_ADDR: no option of this run"):
        parse_config([], {"TRAINER_STATUS_PORT_8080_TCP_ADDR": "10.43.0.10"})  # no such Service


def test_log_interval_is_a_whole_number_of_calls():
    assert parse_config(["--log-every", "100", "--steps-per-loop", "16"], {}).effective_log_every == 112
    assert parse_config(["--log-every", "5", "--steps-per-loop", "16"], {}).effective_log_every == 16


def run_trainer(*args, env=None):
    return run_module("trainer", *args, env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=120)


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


@pytest.mark.parametrize("model_dir", ["gs://bucket/run", "s3://bucket/run", "hdfs://namenode/run", "file:///tmp/run"])
def test_a_model_dir_on_object_storage_exits_2_before_training_naming_what_works(model_dir, tmp_path):
    # Before: gs:// warned "Checkpoint ignored", trained, then died with a traceback (exit 1); s3:// was Unimplemented.
    result = run_trainer("--dataset", "synthetic", "--model-dir", model_dir, env={"HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert f"--model-dir {model_dir}:" in result.stderr and "Traceback" not in result.stderr, result.stderr
    expected = "without file://" if model_dir.startswith("file") else "mounted volume: a ReadWriteMany claim"
    assert expected in result.stderr, result.stderr
    assert (
        not any(tmp_path.iterdir()) and not pathlib.Path(ROOT, model_dir.split("/")[0]).exists()
    )  # nothing written, not even a local "gs:" dir


def test_an_empty_variable_means_the_default_as_settings_env_leaves_the_data_settings():
    # Before, TRAINER_NUM_CLASSES= stopped every pod with "expected a int", and TRAINER_IMAGE_FEATURE= read no image.
    empty = {"TRAINER_NUM_CLASSES": "", "TRAINER_IMAGE_FEATURE": "", "TRAINER_TRAIN_FILES": ""}
    config = parse_config([], environ=empty)
    records = config.group(RecordOptions)
    assert (records.num_classes, records.image_feature, records.train_files) == (0, "image", "")


def test_a_dataset_kinds_options_keep_their_flags_variables_precedence_and_help_heading():
    # They left the core Config for their dataset's group: the names settings.env and the manifests use stay.
    environ = {"TRAINER_NUM_CLASSES": "5", "TRAINER_IMAGE_SHAPE": "64x64x3", "TRAINER_DATA_DIR": "/from/env"}
    config = parse_config(["--num-classes", "7", "--download"], environ)
    records, tfds = config.group(RecordOptions), config.group(TfdsOptions)
    assert (records.num_classes, records.image_shape, records.label_feature) == (7, "64x64x3", "label")
    assert (tfds.data_dir, tfds.download) == ("/from/env", True)
    assert not hasattr(config, "num_classes") and config.to_dict()["train_files"] == ""
    core = read_core(["--download"], {}).config  # __main__ refuses --download in a group with it
    assert core.group(TfdsOptions).download
    text = " ".join(build_parser({}, catalog.option_groups()).format_help().split())
    assert "dataset tfrecord (your TFRecord files): --train-files" in text
    assert "TFDS datasets (--dataset <a TFDS name>): --data-dir" in text


def test_a_negative_class_count_exits_2():
    result = run_trainer("--num-classes", "-1")
    assert result.returncode == 2 and "--num-classes must be 0 (unset) or a positive count" in result.stderr


FORK_MODULE = """
import dataclasses
import os
import pathlib
from trainer.api import NoOptions, Task, datasets, option, register

@dataclasses.dataclass(frozen=True)
class {name}Options:
    width: int = option(3, "a fork's own option", at_least=1)

@register("{name}_task")
class {name}Task(Task):
    Options = {name}Options

@datasets.register("{name}_data")
def {name}_data(config):
    raise NotImplementedError
"""


def fork_module(tmp_path, monkeypatch, name, tasks=1):
    """A fork's module, importable as NAME, registering TASKS tasks and one dataset."""
    text = FORK_MODULE.format(name=name)
    for extra in range(1, tasks):
        text += f"\n@register('{name}_task_{extra}')\nclass Extra{extra}(Task):\n    Options = NoOptions\n"
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_one_module_flag_registers_a_forks_task_and_dataset_and_its_one_task_is_the_default(tmp_path, monkeypatch):
    module = fork_module(tmp_path, monkeypatch, "fork_one")
    config = parse_config(["--module", module, "--dataset", "fork_one_data", "--width", "5"], {})
    assert config.task == "fork_one_task" and config.to_dict()["width"] == 5
    catalog.check_dataset(config)  # the module's dataset is known
    # The same from the settings alone (TRAINER_MODULE in settings.env reaches every pod), and --task still wins.
    assert parse_config([], {"TRAINER_MODULE": module}).task == "fork_one_task"
    assert parse_config(["--task", "image_classification"], {"TRAINER_MODULE": module}).task == "image_classification"


def test_a_module_with_several_tasks_asks_for_one_by_name(tmp_path, monkeypatch):
    module = fork_module(tmp_path, monkeypatch, "fork_two", tasks=2)
    with pytest.raises(ConfigError, match="--module fork_two registers the tasks fork_two_task, fork_two_task_1: "):
        parse_config(["--module", module], {})
    assert parse_config(["--module", module, "--task", "fork_two_task_1"], {}).task == "fork_two_task_1"


def test_without_a_module_the_task_is_image_classification():
    assert parse_config([], {}).task == "image_classification"

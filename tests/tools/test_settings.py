"""k8s/base/settings.env as defaults: the pinned versions agree, and the environment and make's command line win
over every key for make, the Python scripts and the shell scripts, down to what they would create."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

import engines_here
import stub_tools
from kubernetes_ranges import outside_ranges
from multiworker import python_prints
from scripts.common import settings as project_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]

SETTINGS = project_settings.load_file()
# What make's recipes and the scripts need from the system, without kubectl.
TOOLS = ("make", "sh", "bash", "grep", "sed", "git", "dirname", "uname", "cat", "env", "touch", "head")


# Each pinned engine (its version setting) and the Kubernetes versions its own CI tests at that tag; an engine a fork
# deleted takes its pins with its folder.
ENGINE_PINS = tuple(
    (version, tested)
    for version, tested in (
        ("TRAINING_OPERATOR_VERSION", "OPERATOR_TESTED_KUBERNETES"),
        ("JOBSET_VERSION", "JOBSET_TESTED_KUBERNETES"),
        ("KUBEFLOW_TRAINER_VERSION", "KUBEFLOW_TRAINER_TESTED_KUBERNETES"),
        ("KUEUE_VERSION", "KUEUE_TESTED_KUBERNETES"),  # opt-in, for gang admission
        ("KATIB_VERSION", "KATIB_TESTED_KUBERNETES"),  # opt-in, for make tune-cluster
    )
    if version in SETTINGS
)
# Every tested list (the engines' and the serving stack's, tests/serving/test_cluster_pipeline.py) and the setting
# that records the release whose CI it was read at, with the pinned version that release must be.
READ_AT = (
    *((version, tested, tested.replace("_TESTED_KUBERNETES", "_TESTED_AT_VERSION")) for version, tested in ENGINE_PINS),
    ("KSERVE_VERSION", "KSERVE_TESTED_KUBERNETES", "KSERVE_TESTED_AT_VERSION"),
    ("ARGO_WORKFLOWS_VERSION", "ARGO_WORKFLOWS_TESTED_KUBERNETES", "ARGO_WORKFLOWS_TESTED_AT_VERSION"),
)


def stale_ranges(settings: dict[str, str]) -> list[str]:
    """Each tested list read at another release than the one pinned (empty: every list is the pin's)."""
    return [
        f"{tested} was read at {settings.get(read_at)!r} ({read_at}), but {version} pins {settings[version]}: read the "
        f"Kubernetes versions its CI tests at {settings[version]} and record both"
        for version, tested, read_at in READ_AT
        if settings.get(read_at) != settings[version]
    ]


def untested_pairs(settings: dict[str, str]) -> list[str]:
    """Why K3S_IMAGE's Kubernetes is not one that every pinned engine's CI tests at its tag, or that our cluster
    suite ran every engine on (empty: it is)."""
    return outside_ranges(settings, settings["K3S_IMAGE"], dict(ENGINE_PINS))


def test_the_k3s_image_runs_a_kubernetes_minor_every_pinned_engine_is_tested_on():
    assert untested_pairs(SETTINGS) == []


def test_every_tested_list_was_read_at_the_pinned_version():
    assert stale_ranges(SETTINGS) == []


@pytest.mark.parametrize("version, tested, read_at", READ_AT)
def test_a_version_bumped_without_its_tested_list_read_again_is_caught(version, tested, read_at):
    bumped = re.sub(r"\.(\d+)$", lambda m: f".{int(m.group(1)) + 1}", SETTINGS[version])
    (problem,) = stale_ranges({**SETTINGS, version: bumped})
    assert problem.startswith(f"{tested} was read at {SETTINGS[version]!r}") and f"{version} pins {bumped}" in problem


def test_the_version_check_catches_the_old_pin():
    assert "1.31" in untested_pairs({**SETTINGS, "K3S_IMAGE": "rancher/k3s:v1.31.5-k3s1"})[0]


@engines_here.needs("jobset")
def test_the_version_check_names_each_engine_that_leaves_a_minor_out():
    # 1.35: the operator and Trainer v2 test it, JobSet v0.12.0 and Katib v0.19.0 do not (nothing here ran 1.35).
    jobset, katib = untested_pairs({**SETTINGS, "K3S_IMAGE": "rancher/k3s:v1.35.0-k3s1"})
    assert f"JOBSET_VERSION {SETTINGS['JOBSET_VERSION']} is tested on" in jobset
    assert f"KATIB_VERSION {SETTINGS['KATIB_VERSION']} is tested on" in katib


@engines_here.needs("jobset", "trainjob")
def test_a_minor_past_the_engines_ranges_is_accepted_only_with_the_run_here_that_vouches_for_it():
    past = {**SETTINGS, "K3S_IMAGE": "rancher/k3s:v1.36.3-k3s1"}
    vouched = {**past, "RUN_HERE_KUBERNETES": "v1.36.3", "RUN_HERE_SUITE": "scripts/node/tests"}
    assert untested_pairs(vouched) == []
    not_recorded = untested_pairs({**vouched, "RUN_HERE_SUITE": ""})
    # JobSet v0.12.0 (1.32-1.34), the operator and Trainer (to 1.35), Katib (to 1.34) leave 1.36 out; Kueue tests it.
    assert {line.split(" is tested on")[0].split("; ")[1].split()[0] for line in not_recorded} == {
        "TRAINING_OPERATOR_VERSION",
        "JOBSET_VERSION",
        "KUBEFLOW_TRAINER_VERSION",
        "KATIB_VERSION",
    }
    assert all("no run here is recorded" in line for line in not_recorded)
    other_minor = untested_pairs({**vouched, "K3S_IMAGE": "rancher/k3s:v1.37.2-k3s1"})
    assert other_minor and all("the run here was on another minor" in line for line in other_minor)


@engines_here.needs("jobset", "trainjob")
def test_both_engines_that_run_on_jobset_install_the_pinned_jobset():
    # ENGINE=jobset applies k8s/engines/jobset; Trainer v2 applies it too (its ./jobset), so one cluster never holds
    # two JobSets; the image the install runs is the pinned release's.
    engines = ROOT / "k8s" / "engines"
    under_trainer = yaml.safe_load((engines / "trainjob" / "jobset" / "kustomization.yaml").read_text())
    assert (engines / "trainjob" / "jobset" / under_trainer["resources"][0]).resolve() == engines / "jobset"
    jobset = yaml.safe_load((engines / "jobset" / "kustomization.yaml").read_text())
    assert [image["newTag"] for image in jobset["images"]] == [SETTINGS["JOBSET_VERSION"]]
    assert all(ref.endswith("?ref=JOBSET_COMMIT") for ref in jobset["resources"])


def dry_make(
    target: str, *assignments: str, env_overrides: dict[str, str] | None = None, path: str | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_overrides or {})}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["make", "-n", target, *assignments], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )


def script_command(output: str, script: str) -> tuple[dict[str, str], list[str]]:
    """The environment assignments and argv of the recipe line that runs `script`."""
    line = next(line for line in output.splitlines() if script in line)
    words = shlex.split(line)
    at = next(i for i, word in enumerate(words) if "=" not in word)
    return dict(word.split("=", 1) for word in words[:at]), words[at:]


OVERRIDES = [
    ("WORKERS", "3", "--workers", "3"),
    ("DATASET", "mnist", "--dataset", "mnist"),
    ("TRAINER_DATASET", "cifar10", "--dataset", "cifar10"),
    ("EPOCHS", "7", "--epochs", "7"),
]


@pytest.mark.parametrize(
    "target, script", [("submit", "scripts.cluster.submit"), ("run-local", "scripts.localrun.run_local")]
)
@pytest.mark.parametrize("spelling", ["environment", "command line"])
@pytest.mark.parametrize("key, value, flag, expected", OVERRIDES)
def test_environment_and_command_line_both_win_over_settings(target, script, spelling, key, value, flag, expected):
    # Before: settings.env was included with KEY=VALUE lines, which beat the environment (`--workers 2`).
    if spelling == "environment":
        result = dry_make(target, env_overrides={key: value})
    else:
        result = dry_make(target, f"{key}={value}")
    assert result.returncode == 0, result.stderr
    _, argv = script_command(result.stdout, script)
    assert argv[argv.index(flag) + 1] == expected, argv


@pytest.mark.parametrize("spelling", ["environment", "command line"])
def test_a_job_name_and_namespace_override_reaches_the_job_submit_would_create(spelling):
    overrides = {"JOB_NAME": "team-a-run", "NAMESPACE": "team-a"}
    if spelling == "environment":
        result = dry_make("submit", env_overrides=overrides)
    else:
        result = dry_make("submit", *(f"{k}={v}" for k, v in overrides.items()))
    assert result.returncode == 0, result.stderr
    env, argv = script_command(result.stdout, "scripts.cluster.submit")
    assert env["JOB_NAME"] == "team-a-run" and env["NAMESPACE"] == "team-a"
    clean_env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    shown = subprocess.run(
        [*argv, "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120, env={**clean_env, **env}
    )
    assert shown.returncode == 0, shown.stderr
    body = json.loads(shown.stdout)
    assert body["metadata"]["name"] == "team-a-run"
    assert body["metadata"]["namespace"] == "team-a"


def test_a_job_name_in_the_environment_reaches_the_manifests_run_local_reads():
    code = (
        "from scripts.common import manifest; from scripts.localrun import manifests as m; "
        "print(m.parse(manifest.render(), 'k8s').name)"
    )
    assert python_prints(code, {**os.environ, "JOB_NAME": "mine"}) == "mine"


def test_a_value_with_a_space_from_the_environment_is_refused_like_one_in_the_file():
    with pytest.raises(ValueError, match="WORKERS"):
        project_settings.load(environ={"WORKERS": "3 4"})


def test_the_shell_scripts_let_the_environment_win_over_settings():
    # Before: `source k8s/settings.env` (now k8s/base/settings.env) overwrote IMAGE_NAME from the environment.
    result = subprocess.run(
        [str(ROOT / "scripts" / "image" / "build-image.sh"), "--print-image"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "IMAGE_NAME": "my-trainer", "IMAGE_TAG": "t1", "IMAGE_TF_FLAVOUR": "gpu"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "my-trainer:t1-gpu"


@pytest.mark.parametrize("spelling", ["environment", "command line"])
def test_the_image_name_and_flavour_reach_make_submit(spelling):
    # Before: the flavour given to `make image` was forgotten by a plain `make submit` unless given again,
    # and IMAGE_NAME on make's command line never reached the script that names the image.
    overrides = {"IMAGE_NAME": "my-trainer", "IMAGE_TF_FLAVOUR": "gpu"}
    if spelling == "environment":
        result = dry_make("submit", "IMAGE_TAG=t1", env_overrides=overrides)
    else:
        result = dry_make("submit", "IMAGE_TAG=t1", *(f"{k}={v}" for k, v in overrides.items()))
    assert result.returncode == 0, result.stderr
    _, argv = script_command(result.stdout, "scripts.cluster.submit")
    assert argv[argv.index("--image") + 1] == "my-trainer:t1-gpu"


def tool_path(tmp_path: pathlib.Path, stubs: dict[str, str]) -> str:
    """A PATH holding make's tools, this Python, and the given stubs (name -> bash body), but no kubectl."""
    path = stub_tools.path_with(tmp_path, stubs, tools=TOOLS)
    (pathlib.Path(path) / "python3.11").symlink_to(sys.executable)
    return path


def test_a_stub_on_the_tool_path_leaves_the_systems_tool_as_it_was(tmp_path, monkeypatch):
    # Before, the stub was written through the link to the real tool: the flavour test's `uname` stub replaced
    # /usr/bin/uname (root runs CI), and every later image build read the stub's machine. The "system" tool here is
    # a copy, so a regression cannot break the machine's.
    system = tmp_path / "system"
    system.mkdir()
    system_uname = system / "uname"
    shutil.copy2(shutil.which("uname"), system_uname)
    before = system_uname.read_bytes()
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: str(system_uname) if tool == "uname" else which(tool))
    stubs = pathlib.Path(tool_path(tmp_path, {"uname": "echo stub"}))
    assert subprocess.run([stubs / "uname"], capture_output=True, text=True).stdout == "stub\n"
    assert system_uname.read_bytes() == before


# What Debian 12's kubectl v1.20.2 (kustomize v2) answers; the real one was checked by hand.
OLD_KUBECTL = """if [[ $1 == version ]]; then
  echo 'Client Version: version.Info{Major:"1", Minor:"20", GitVersion:"v1.20.2"}'
else echo 'Error: json: unknown field "envs"' >&2; exit 1; fi"""


@pytest.mark.parametrize("target", ["run-local", "submit"])
@pytest.mark.parametrize(
    "kubectl, says", [(None, "kubectl is not installed"), (OLD_KUBECTL, "kubectl v1.20.2 cannot render k8s/")]
)
def test_run_local_and_submit_stop_before_installing_anything_without_a_kubectl_that_renders(
    tmp_path, target, kubectl, says
):
    venv = tmp_path / "venv"
    path = tool_path(tmp_path, {"kubectl": kubectl} if kubectl else {})
    result = subprocess.run(
        ["make", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path},
        timeout=120,
    )
    assert result.returncode != 0
    assert not venv.exists(), "make installed the venv before it checked kubectl"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "https://kubernetes.io/docs/tasks/tools/" in lines[0], lines
    assert result.stdout == ""


@pytest.mark.parametrize(
    "machine, flavour, suffix",
    [("aarch64", "", "-tf"), ("arm64", "", "-tf"), ("x86_64", "", ""), ("aarch64", "cpu", ""), ("x86_64", "tf", "-tf")],
)
def test_the_image_flavour_defaults_to_tf_on_arm64_hosts(tmp_path, machine, flavour, suffix):
    # Before: cpu everywhere, and tensorflow-cpu 2.21.0 has no linux/aarch64 wheel; tf was refused.
    stubs = tool_path(tmp_path, {"uname": f"echo {machine}", "docker": f'echo "$*" >> {tmp_path}/docker-args; exit 0'})
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "IMAGE_TAG": "t1",
        "IMAGE_TF_FLAVOUR": flavour,
        "CONTAINER_TOOL": "docker",
        "BASE_IMAGE_DIGEST": "sha256:" + "0" * 64,  # a pinned base (test_image_lock.py checks the refusal)
    }
    script = str(ROOT / "scripts" / "image" / "build-image.sh")
    printed = subprocess.run([script, "--print-image"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert printed.stdout.strip() == f"{SETTINGS['IMAGE_NAME']}:t1{suffix}", printed.stderr
    built = subprocess.run([script], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert built.returncode == 0, built.stderr
    expected = "tf" if suffix == "-tf" else "cpu"
    assert f"--build-arg TF_FLAVOUR={expected} " in (tmp_path / "docker-args").read_text()


# Values a branch name or a careless override could carry, each of which a shell would run.
UNSAFE = ["x';touch PWNED;'", "$(shell touch PWNED)", "x;touch PWNED", "a b", "x`touch PWNED`", "x\ntouch PWNED"]


@pytest.mark.parametrize("value", UNSAFE, ids=["quote", "make-shell", "semicolon", "space", "backtick", "newline"])
@pytest.mark.parametrize("spelling", ["command line", "environment"])
def test_make_refuses_an_unsafe_value_naming_the_key_before_any_command_runs(value, spelling):
    # Before: the Makefile pasted JOB_NAME='<value>' into the recipes' shell commands, and a ' ended the quote.
    assignments, env = ([f"JOB_NAME={value}"], None) if spelling == "command line" else ([], {"JOB_NAME": value})
    result = subprocess.run(
        ["make", "-n", "delete", *assignments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    assert result.returncode != 0
    assert "setting JOB_NAME=" in result.stderr and "cannot be passed on safely" in result.stderr, result.stderr
    assert not (ROOT / "PWNED").exists()


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("JOB_NAME", "My_Job", "DNS label"),
        ("NAMESPACE", "team-a.b", "DNS label"),
        ("WORKERS", "2x", "digits"),
        ("MODEL_ROOT", "relative/path", "absolute path"),
        ("TRAINING_OPERATOR_COMMIT", "v1.9.4", "40 hexadecimal digits"),
        ("CERT_MANAGER_MANIFEST_SHA256", "abc", "64 lower-case hexadecimal digits"),
        ("BASE_IMAGE_DIGEST", "latest", "image digest"),
        ("TRAINER_TRAIN_FILES", "/data/a|b", "letters, digits"),
        # Not a line of trainer.env, only an example there: the environment's value reaches the pods, so it is held too.
        ("TRAINER_CLASS_NAMES", "cat;dog", "k8s/base/trainer.env"),
    ],
)
def test_the_scripts_hold_each_key_to_its_own_rule_naming_it(key, value, allowed):
    with pytest.raises(project_settings.SettingsError) as refused:
        project_settings.load(environ={key: value})
    assert f"setting {key}={value!r} is not allowed" in str(refused.value) and allowed in str(refused.value)


def test_every_default_in_the_settings_file_passes_its_rule():
    assert project_settings.problems(project_settings.load_file()) == []


def cluster_options() -> dict[str, dataclasses.Field]:
    """The trainer's options a cluster user sets in settings.env, by name: a fork's module and task, which data
    and how it is read (the core data knobs, every option of your TFRecord files and image folder, the TFDS data
    dir), what bad data does, and the status port the Service reaches. The manifests set what else a pod needs (its
    model dir, its threads); --download is no worker's; the older --dataset-module is --module's, which names a fork."""
    from trainer.data.image_folder import FolderOptions
    from trainer.data.tfds import TfdsOptions
    from trainer.data.tfrecord import RecordOptions
    from trainer.settings.config import Config
    from trainer.settings.options import option_fields

    kinds = (RecordOptions, FolderOptions)
    fields = {field.name: field for options in (Config, *kinds, TfdsOptions) for field in option_fields(options)}
    chosen = ("module", "task", "dataset", "data_dir", "on_nonfinite", "status_port")
    return {name: fields[name] for name in (*chosen, *(field.name for kind in kinds for field in option_fields(kind)))}


def trainer_file_examples() -> dict[str, str]:
    """trainer.env's commented-out example lines (# TRAINER_X=value), by key."""
    lines = project_settings.TRAINER_FILE.read_text().splitlines()
    return dict(line[2:].split("=", 1) for line in lines if re.match(r"# TRAINER_[A-Z_]+=", line))


def test_the_trainer_file_lists_or_shows_the_trainer_options_a_cluster_user_sets_and_no_other():
    from trainer.settings.options import env_name

    listed = {key for key in SETTINGS if key.startswith("TRAINER_")} | set(trainer_file_examples())
    meant = {env_name(name) for name in cluster_options()}
    assert listed == meant, (
        f"missing from trainer.env: {sorted(meant - listed)}; not such an option: {sorted(listed - meant)}"
    )


def test_the_trainer_files_examples_are_values_the_trainer_takes():
    from trainer.context import parse_config
    from trainer.settings.options import env_name

    examples = trainer_file_examples()
    assert examples and not examples.keys() & SETTINGS.keys()
    config = parse_config(["--dataset", "tfrecord"], dict(examples))
    read = {env_name(name): str(value) for group in config.groups for name, value in vars(group).items()}
    assert {key: read.get(key) for key in examples} == examples


def test_a_trainer_setting_with_choices_takes_one_of_them_or_empty_for_the_default():
    from trainer.settings.options import env_name

    for name, field in cluster_options().items():
        choices = field.metadata["choices"]
        if choices:
            pattern, allowed = project_settings.rule_of(env_name(name))
            assert all(re.fullmatch(pattern, value) for value in (*choices, "")), (name, pattern)
            assert not re.fullmatch(pattern, "maybe") and all(choice in allowed for choice in choices), (name, allowed)


def test_a_make_target_stops_with_exit_2_naming_the_key_before_its_script_runs():
    # k3d-down: no install step in front of it; the check is the recipe's first line.
    result = subprocess.run(["make", "k3d-down", "WORKERS=two"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "setting WORKERS='two' is not allowed: use digits" in result.stderr
    assert "k3d" not in result.stdout


# Before: each of these passed; an emptied commit made k3d-up install the operator's default branch, an empty port
# crashed the cluster generator with a traceback, and ../.. led the published base path off the volume's folder.
REFUSED = [
    ("SELECTION_ROOT", "../../etc", "no . or .. segment"),
    ("SELECTION_ROOT", "selected/./x", "no . or .. segment"),
    ("MODEL_ROOT", "/mnt/training/../../etc", "no . or .. segment"),
    ("SERVE_PORT", "", "is empty, and the scripts need it: set it to digits"),
    ("TRAINING_OPERATOR_COMMIT", "", "is empty, and the scripts need it: set it to a full commit SHA"),
    ("MOUNT_PATH", "", "is empty, and the scripts need it"),
]


@pytest.mark.parametrize("key, value, says", REFUSED)
def test_make_refuses_a_path_leaving_its_folder_or_an_emptied_commit_port_or_path(key, value, says):
    result = subprocess.run(
        ["make", "k3d-down", f"{key}={value}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and f"setting {key}" in result.stderr and says in result.stderr, result.stderr
    assert "k3d" not in result.stdout


@pytest.mark.parametrize("key, value, says", REFUSED)
def test_the_scripts_refuse_the_same_values_from_the_settings_file(tmp_path, key, value, says):
    edited = tmp_path / "settings.env"
    edited.write_text("".join(f"{k}={value if k == key else v}\n" for k, v in SETTINGS.items()))
    with pytest.raises(project_settings.SettingsError, match=re.escape(says)):
        project_settings.load(edited, environ={})


# Settings by owner: the forker's two files hold names, data, resources and the engine; each pin lives with what
# installs it; a key a fork still sets in the old place is refused naming its new one.
PINNED = re.compile(r"_(VERSION|COMMIT|SHA256|DIGEST|TESTED_KUBERNETES|TESTED_AT_VERSION)$|^K3S_IMAGE$|^RUN_HERE_")


def test_the_forkers_files_hold_no_pin_and_about_thirty_keys():
    forker = project_settings.load_file(project_settings.SETTINGS_FILE)
    trainer = project_settings.load_file(project_settings.TRAINER_FILE)
    assert not [key for key in {**forker, **trainer} if PINNED.search(key)]
    assert len(forker) <= 30 and {"ENGINE", "JOB_NAME", "WORKERS", "WORKER_CPU_REQUEST"} <= set(forker)
    assert all(key.startswith("TRAINER_") for key in trainer)
    for key in SETTINGS:
        if PINNED.search(key) and key != "TF_SERVING_VERSION" and not key.startswith("NODE_"):
            assert project_settings.home(key) not in ("k8s/base/settings.env", "k8s/base/trainer.env"), key


def check_in_a_copy(tmp_path: pathlib.Path, file: str, line: str) -> subprocess.CompletedProcess:
    root = tmp_path / "project"
    for folder in ("scripts", "k8s", "trainer"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    with (root / file).open("a") as settings:
        settings.write(line + "\n")
    check = [sys.executable, "-B", "-m", "scripts.common.settings", "--check"]
    return subprocess.run(check, cwd=root, capture_output=True, text=True, timeout=60)


@engines_here.needs("jobset")
def test_a_pin_a_fork_still_sets_in_its_settings_file_is_refused_naming_its_new_home(tmp_path):
    refused = check_in_a_copy(tmp_path, "k8s/base/settings.env", "JOBSET_VERSION=v0.13.0")
    assert refused.returncode == 2
    assert "JOBSET_VERSION is set in k8s/base/settings.env and in k8s/engines/jobset/settings.env" in refused.stderr


def test_a_trainer_variable_in_the_settings_file_is_refused_naming_trainer_env(tmp_path):
    refused = check_in_a_copy(tmp_path, "k8s/base/settings.env", "TRAINER_PER_WORKER_BATCH_SIZE=128")
    assert refused.returncode == 2
    assert "TRAINER_PER_WORKER_BATCH_SIZE belong in k8s/base/trainer.env" in refused.stderr, refused.stderr


@engines_here.needs("jobset")
def test_a_moved_pin_still_wins_from_the_environment_and_make_s_command_line():
    assert project_settings.load(environ={"JOBSET_VERSION": "v0.13.0"})["JOBSET_VERSION"] == "v0.13.0"
    dry = dry_make("k3d-up", "KUEUE_VERSION=v0.20.0", "ENGINE=jobset")
    assert "KUEUE_VERSION='v0.20.0'" in dry.stdout, dry.stdout + dry.stderr

"""The cluster shell scripts where no cluster exists: the messages a user gets when docker, k3d, kubectl or git is
missing or Docker is not running (make lint runs shellcheck on every script)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

import engines_here
from project_copy import copy_project
from scripts.common.engine_folders import names as engine_names
from stub_tools import path_with, run_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTER_SCRIPTS = ROOT / "scripts" / "cluster"


def test_k3d_up_names_every_missing_tool_with_where_to_get_it(tmp_path):
    result = run_script(CLUSTER_SCRIPTS / "k3d-up.sh", path_with(tmp_path, {}))
    assert result.returncode == 1
    for tool, hint in (
        ("docker", "docs.docker.com"),
        ("k3d", "k3d.io"),
        ("kubectl", "kubernetes.io/docs/tasks/tools"),
        ("git", "git-scm.com"),
    ):
        assert f"error: {tool} is not installed" in result.stderr and hint in result.stderr, result.stderr


def test_k3d_up_says_when_docker_is_installed_but_not_running(tmp_path):
    stubs = {"docker": "exit 1", "k3d": "exit 0", "kubectl": "exit 0", "git": "exit 0"}
    result = run_script(CLUSTER_SCRIPTS / "k3d-up.sh", path_with(tmp_path, stubs))
    assert result.returncode == 1
    assert "daemon does not answer" in result.stderr
    assert "not installed" not in result.stderr


# What a release manifest download returns in these tests, and its sha256 as the settings would record it.
FAKE_MANIFEST = "apiVersion: v1\nkind: Namespace\nmetadata: {name: cert-manager}\n"
FAKE_MANIFEST_SHA256 = hashlib.sha256(FAKE_MANIFEST.encode()).hexdigest()
# KServe's install script as its release writes it: each manifest a heredoc that a function prints.
KSERVE_HEREDOCS = {
    "get_kserve_crd_manifest": ("KSERVE_CRD_MANIFEST_EOF", "kserve-crds.yaml"),
    "get_kserve_core_manifest": ("KSERVE_CORE_MANIFEST_EOF", "kserve.yaml"),
    "get_kserve_runtime_manifests": ("KSERVE_RUNTIME_MANIFEST_EOF", "kserve-runtimes.yaml"),
}
FAKE_KSERVE_SCRIPT = "#!/bin/bash\nset -e\n" + "".join(
    f"{function}() {{\n    cat <<'{end}'\nkind: ConfigMap\nmetadata: {{name: {name}}}\n{end}\n}}\n\n"
    for function, (end, name) in KSERVE_HEREDOCS.items()
)
FAKE_KSERVE_SCRIPT_SHA256 = hashlib.sha256(FAKE_KSERVE_SCRIPT.encode()).hexdigest()
# The tools the install steps use beyond the basics (the checked download, the kustomization copy).
INSTALL_TOOLS = ("mktemp", "rm", "cp", "sed", "awk", "sha256sum", "mv", "find", "grep", "mkdir")


def k3d_up_with(
    tmp_path: pathlib.Path,
    engine: str,
    standalone_jobset: bool = False,
    kserve_download: str = FAKE_KSERVE_SCRIPT,
    root: pathlib.Path = ROOT,
    katib_zip: pathlib.Path | None = None,
    local_path_zip: pathlib.Path | None = None,
    servers: str | None = None,
    node_mounts: str | None = None,
    **environ: str,
):
    """k3d-up.sh for ENGINE with docker, k3d, kubectl and curl as recording stubs (no cluster): the result, its
    kubectl apply calls, and what each applied kustomization directory and file held (each directory also on its
    own, under applied.each/<call number>; and curl.log: the command line of each curl call's parent process; k3d.log:
    each k3d call's arguments, shell-quoted). SERVERS (running/total) makes the cluster exist already, and
    NODE_MOUNTS is what docker inspect says each node container mounts (None: no such container)."""
    tmp_path.mkdir(exist_ok=True)
    log = tmp_path / "kubectl.log"
    seen = tmp_path / "applied"
    seen.mkdir()
    jobset_there = 0 if standalone_jobset else 1
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(FAKE_MANIFEST)
    kserve_script = tmp_path / "kserve-install.sh"
    kserve_script.write_text(kserve_download)
    cp, mkdir, wc, tr = (shutil.which(tool) for tool in ("cp", "mkdir", "wc", "tr"))
    inspect = "exit 1" if node_mounts is None else f'echo "{node_mounts}"'
    stubs = {
        "docker": f'case "$1" in inspect) {inspect};; esac; exit 0',
        "git": "exit 0",
        "k3d": (
            f'printf "%q " "$@" >> {tmp_path / "k3d.log"}; echo >> {tmp_path / "k3d.log"}; case "$1 $2" in '
            f'"cluster get") exit {1 if servers is None else 0};; "cluster list") echo "distml {servers} 1/1 true";; '
            "esac; exit 0"
        ),
        "kubectl": (
            f'echo "$*" >> {log}; n=$({wc} -l < {log}); '
            f'for a in "$@"; do [ -d "$a" ] && {cp} -R "$a"/. {seen}/; [ -f "$a" ] && {cp} "$a" {seen}/; '
            f'[ -d "$a" ] && {mkdir} -p {seen}.each/$n && {cp} -R "$a"/. {seen}.each/$n/; done; '
            f'case "$*" in *"-n jobset-system get deployment jobset-controller-manager"*) exit {jobset_there};; '
            '*"get deployment jobset-controller-manager"*) exit 1;; esac; exit 0'
        ),
        # curl ... --output FILE URL: KServe's install script or another release manifest, as if downloaded.
        "curl": (
            f"{tr} '\\0' ' ' < /proc/$PPID/cmdline >> {tmp_path / 'curl.log'}; echo >> {tmp_path / 'curl.log'}; "
            'while [ "$1" != "--output" ]; do shift; done; '
            f'case "$3" in *kserve*) {cp} {kserve_script} "$2";; *katib*) {cp} {katib_zip} "$2";; '
            f'*local-path-provisioner*) {cp} {local_path_zip} "$2";; '
            f'*) {cp} {manifest} "$2";; esac'
        ),
    }
    if katib_zip is not None:  # Katib's kustomization rendered by the real kubectl as applied, beside the copy
        real = shutil.which("kubectl")
        stubs["kubectl"] = (
            f'case "$*" in *"-k "*/engines/katib) {real} kustomize "${{@: -1}}" > {tmp_path / "katib.yaml"};; esac; '
            + stubs["kubectl"]
        )
    path = path_with(tmp_path, stubs)
    for tool in INSTALL_TOOLS:
        (pathlib.Path(path) / tool).symlink_to(shutil.which(tool))
    result = subprocess.run(
        [shutil.which("bash"), str(root / "scripts" / "cluster" / "k3d-up.sh")],
        capture_output=True,
        text=True,
        env={
            "PATH": path,
            "HOME": os.environ.get("HOME", "/tmp"),
            "ENGINE": engine,
            **environ,
        },
        timeout=60,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return result, [call for call in calls if " apply " in f" {call} "], seen


def project_with_setting(tmp_path: pathlib.Path, key: str, value: str) -> pathlib.Path:
    """A copy of the scripts and manifests whose settings file that holds KEY has KEY=VALUE: an empty value there is
    one the environment cannot give (the scripts keep the file's value over an empty variable)."""
    from scripts.common import settings as project_settings

    root = copy_project(tmp_path / "project", files=(), folders=("scripts", "k8s"))
    settings = root / project_settings.home(key)
    lines = settings.read_text().splitlines()
    assert any(line.startswith(f"{key}=") for line in lines)
    settings.write_text("\n".join(f"{key}={value}" if line.startswith(f"{key}=") else line for line in lines) + "\n")
    return root


def settings_file() -> dict[str, str]:
    from scripts.common import settings as project_settings

    return project_settings.load_file()


def without_scratch(call: str) -> str:
    """An apply call with its temporary directory spelt SCRATCH."""
    return re.sub(r"/\S*/tmp\.\w+", "SCRATCH", call)


@pytest.mark.parametrize(
    "engine, installs",
    engines_here.present(
        ("tfjob", ["-k github.com/kubeflow/trainer.git/manifests/overlays/standalone?ref={TRAINING_OPERATOR_COMMIT}"]),
        ("jobset", ["-k SCRATCH/engines/jobset"]),
        (
            "trainjob",
            [
                "-k SCRATCH/engines/trainjob",
                "-k github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref={KUBEFLOW_TRAINER_COMMIT}",
            ],
        ),
    ),
)
def test_k3d_up_installs_the_engine_asked_for_from_a_commit(tmp_path, engine, installs):
    result, applies, applied = k3d_up_with(tmp_path, engine)
    assert result.returncode == 0, result.stderr
    settings = settings_file()
    expected = [line.format(**settings) for line in installs]
    assert [without_scratch(a) for a in applies] == [f"--context k3d-distml apply --server-side {e}" for e in expected]
    assert f"ready: make submit ENGINE={engine}" in result.stdout
    if engine != "tfjob":  # the kustomization applied names the commits, not their placeholders
        refs = re.findall(r"\?ref=(\S+)", (applied / "kustomization.yaml").read_text())
        pins = {settings[{"jobset": "JOBSET_COMMIT", "trainjob": "KUBEFLOW_TRAINER_COMMIT"}[engine]]}
        assert refs and set(refs) == pins


@pytest.mark.parametrize(
    "recorded, complaint",
    [("", "no sha256 is recorded"), ("0" * 64, f"has sha256 {FAKE_MANIFEST_SHA256}, not the recorded")],
)
def test_k3d_up_applies_no_release_manifest_whose_sha256_is_not_the_recorded_one(tmp_path, recorded, complaint):
    root = project_with_setting(tmp_path, "CERT_MANAGER_MANIFEST_SHA256", recorded)
    result, applies, _ = k3d_up_with(tmp_path, "tfjob", SERVE="1", root=root)
    assert result.returncode == 2, result.stderr
    assert [a for a in applies if "cert-manager" in a] == []  # the operator went in; nothing unchecked after it
    assert complaint in result.stderr and FAKE_MANIFEST_SHA256 in result.stderr


def test_an_unrecorded_checksum_is_applied_only_when_asked_and_a_changed_one_never(tmp_path):
    unrecorded = project_with_setting(tmp_path, "CERT_MANAGER_MANIFEST_SHA256", "")
    result, applies, _ = k3d_up_with(tmp_path / "a", "tfjob", SERVE="1", root=unrecorded, ALLOW_UNRECORDED_CHECKSUM="1")
    assert "--context k3d-distml apply -f SCRATCH/cert-manager.yaml" in [without_scratch(a) for a in applies]
    assert "applying it anyway (ALLOW_UNRECORDED_CHECKSUM=1)" in result.stderr and FAKE_MANIFEST_SHA256 in result.stderr
    # KServe's script has its sha256 recorded, and the fake download is not it: refused, flag or not.
    assert result.returncode == 2 and "not the recorded" in result.stderr
    result, applies, _ = k3d_up_with(
        tmp_path / "b", "tfjob", SERVE="1", CERT_MANAGER_MANIFEST_SHA256="0" * 64, ALLOW_UNRECORDED_CHECKSUM="1"
    )
    assert result.returncode == 2 and [a for a in applies if "cert-manager" in a] == []


def test_k3d_up_serve_applies_the_checked_serving_installs(tmp_path):
    """With every checksum as recorded: cert-manager's checked file, KServe's three manifests taken from its checked
    install script (never the script itself), and Argo Workflows from its commit."""
    recorded = {"SERVE": "1", "CERT_MANAGER_MANIFEST_SHA256": FAKE_MANIFEST_SHA256}
    result, applies, applied = k3d_up_with(
        tmp_path / "a", "tfjob", **recorded, KSERVE_INSTALL_SCRIPT_SHA256=FAKE_KSERVE_SCRIPT_SHA256
    )
    assert result.returncode == 0, result.stderr
    assert [without_scratch(a) for a in applies][1:] == [
        "--context k3d-distml apply -f SCRATCH/cert-manager.yaml",
        "--context k3d-distml apply --server-side -f SCRATCH/kserve-crds.yaml",
        "--context k3d-distml apply --server-side -f SCRATCH/kserve.yaml",
        "--context k3d-distml apply --server-side -f SCRATCH/kserve-runtimes.yaml",
        "--context k3d-distml apply -f -",  # the argo namespace
        "--context k3d-distml apply --server-side -k SCRATCH/engines/argo-workflows",
    ]
    for _, name in KSERVE_HEREDOCS.values():  # each manifest is its heredoc's body, nothing of the script around it
        assert (applied / name).read_text() == f"kind: ConfigMap\nmetadata: {{name: {name}}}\n"
    refs = re.findall(r"\?ref=(\S+)", (applied / "kustomization.yaml").read_text())
    assert refs == [settings_file()["ARGO_WORKFLOWS_COMMIT"]]
    # A download that is not KServe's script (its sha256 recorded as if it were): the manifests are not found in it,
    # and k3d-up says so and stops before applying any.
    recorded["KSERVE_INSTALL_SCRIPT_SHA256"] = FAKE_MANIFEST_SHA256
    result, applies, _ = k3d_up_with(tmp_path / "b", "tfjob", kserve_download=FAKE_MANIFEST, **recorded)
    assert result.returncode == 1 and "get_kserve_crd_manifest is not in KServe's install script" in result.stderr
    assert [without_scratch(a) for a in applies][-1] == "--context k3d-distml apply -f SCRATCH/cert-manager.yaml"


COMMITS = (
    "TRAINING_OPERATOR_COMMIT",
    "KUBEFLOW_TRAINER_COMMIT",
    "JOBSET_COMMIT",
    "KUEUE_COMMIT",
    "KSERVE_COMMIT",
    "ARGO_WORKFLOWS_COMMIT",
)


def test_every_install_source_is_pinned_to_a_commit_or_a_sha256():
    settings = settings_file()
    for key in (key for key in COMMITS if key in settings):  # a deleted engine's commit goes with its folder
        assert re.fullmatch(r"[0-9a-f]{40}", settings[key]), key
    assert re.fullmatch(r"[0-9a-f]{64}", settings["KSERVE_INSTALL_SCRIPT_SHA256"])
    for kustomization in (ROOT / "k8s" / "engines").rglob("kustomization.yaml"):
        text = kustomization.read_text()
        assert "releases/download" not in text and "http" not in text, kustomization
        for ref in re.findall(r"\?ref=(\S+)", text):
            assert ref in settings and ref.endswith("_COMMIT"), (kustomization, ref)


@pytest.mark.parametrize("engine", [engine for engine in ("tfjob", "jobset", "trainjob") if engine in engine_names()])
def test_everything_k3d_up_installs_comes_from_a_pinned_commit_or_a_checked_download(tmp_path, engine):
    """What k3d-up really applies, with every add-on asked for (SERVE=1, KUEUE=1): each kustomization from GitHub
    names a pinned commit, each local one (k8s/engines, copied) only pinned commits, and every download is made by
    checked-download.sh."""
    result, applies, applied = k3d_up_with(
        tmp_path,
        engine,
        SERVE="1",
        KUEUE="1",
        CERT_MANAGER_MANIFEST_SHA256=FAKE_MANIFEST_SHA256,
        KSERVE_INSTALL_SCRIPT_SHA256=FAKE_KSERVE_SCRIPT_SHA256,
    )
    assert result.returncode == 0, result.stderr
    settings = settings_file()
    commits = {settings[key] for key in COMMITS if key in settings}
    sources = [call.split(" -k ")[1] for call in applies if " -k " in call]
    assert len(sources) == {"tfjob": 3, "jobset": 3, "trainjob": 4}[engine]  # the engine, Argo, Kueue
    for source in sources:
        if source.startswith("github.com/"):
            assert source.rsplit("?ref=", 1)[-1] in commits, source
    copies = sorted((applied.parent / "applied.each").glob("*/kustomization.yaml"))
    assert len(copies) == sum(not source.startswith("github.com/") for source in sources)
    for copy in copies:
        refs = re.findall(r"\?ref=(\S+)", copy.read_text())
        assert refs and set(refs) <= commits, (copy, refs)
    downloads = (tmp_path / "curl.log").read_text().splitlines()
    assert len(downloads) == 2  # cert-manager's manifest and KServe's install script
    assert all("scripts/cluster/checked-download.sh" in parent for parent in downloads), downloads


def fake_katib_zip(tmp_path: pathlib.Path) -> pathlib.Path:
    """A module zip laid out as the Go module proxy serves Katib's: each component Katib's kustomization names, a
    ConfigMap each."""
    import zipfile

    zip_path = tmp_path / "katib.zip"
    version = settings_file()["KATIB_VERSION"]
    with zipfile.ZipFile(zip_path, "w") as archive:
        for component in ("namespace", "controller", "crd", "db-manager", "postgres", "webhook"):
            where = f"github.com/kubeflow/katib@{version}/manifests/v1beta1/components/{component}"
            archive.writestr(f"{where}/kustomization.yaml", "resources: [objects.yaml]\n")
            archive.writestr(
                f"{where}/objects.yaml", f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {component}}}\n"
            )
    return zip_path


def test_k3d_up_katib_applies_its_module_zip_only_with_the_recorded_sha256(tmp_path):
    zip_path = fake_katib_zip(tmp_path)
    recorded = hashlib.sha256(zip_path.read_bytes()).hexdigest()
    result, applies, _ = k3d_up_with(
        tmp_path / "a", "tfjob", katib_zip=zip_path, KATIB="1", KATIB_MODULE_ZIP_SHA256=recorded
    )
    assert result.returncode == 0, result.stderr
    version = settings_file()["KATIB_VERSION"]
    assert f"checked https://proxy.golang.org/github.com/kubeflow/katib/@v/{version}.zip: sha256 {recorded}" in (
        result.stdout
    )
    assert [without_scratch(a) for a in applies][
        -1
    ] == "--context k3d-distml apply --server-side -k SCRATCH/engines/katib"
    rendered = list(yaml.safe_load_all((tmp_path / "a" / "katib.yaml").read_text()))
    names = {(obj["kind"], obj["metadata"]["name"]) for obj in rendered}
    components = {"namespace", "controller", "crd", "db-manager", "postgres", "webhook"}
    assert {("ConfigMap", name) for name in components} | {("ConfigMap", "katib-config")} <= names
    assert "ready: make tune-cluster ENGINE=tfjob" in result.stdout

    result, applies, _ = k3d_up_with(tmp_path / "b", "tfjob", katib_zip=zip_path, KATIB="1",
                                     KATIB_MODULE_ZIP_SHA256="0" * 64)  # fmt: skip
    assert result.returncode == 2 and f"has sha256 {recorded}, not the recorded" in result.stderr
    assert not [a for a in applies if "katib" in a]


# local-path-provisioner v0.0.30's deploy manifest as its module zip holds it, byte for byte.
LOCAL_PATH_MANIFEST = ROOT / "tests" / "tools" / "fixtures" / "local-path-storage-v0.0.30.yaml"


def render_local_path(manifest: pathlib.Path, storage: str, shared: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("bash"), str(CLUSTER_SCRIPTS / "render-local-path.sh"), str(manifest), storage, shared],
        capture_output=True,
        text=True,
        timeout=60,
    )


def local_path_objects(text: str) -> dict[tuple[str, str], dict]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in yaml.safe_load_all(text) if obj}


def test_the_local_path_renderer_adds_the_shared_class_to_upstreams_manifest_and_changes_nothing_else(tmp_path):
    """Both clusters' storage (make k3d-up NODES=2, make cluster-up) from one script: upstream's objects as published,
    but for local-path made the default (as k3s ships it) and one config per class, local-path-shared's on the
    folder every node mounts."""
    rendered = render_local_path(LOCAL_PATH_MANIFEST, "/node/storage", "/every/node/shared")
    assert rendered.returncode == 0, rendered.stderr
    objects, upstream = local_path_objects(rendered.stdout), local_path_objects(LOCAL_PATH_MANIFEST.read_text())
    assert set(objects) == set(upstream) | {("StorageClass", "local-path-shared")}
    default, shared = objects["StorageClass", "local-path"], objects["StorageClass", "local-path-shared"]
    assert default["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
    assert default["volumeBindingMode"] == "WaitForFirstConsumer"
    assert shared["provisioner"] == default["provisioner"] == "rancher.io/local-path"
    assert "annotations" not in shared["metadata"]  # one default class
    config = objects["ConfigMap", "local-path-config"]["data"]
    assert json.loads(config["config.json"]) == {
        "nodePathMap": [],
        "storageClassConfigs": {
            "local-path": {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["/node/storage"]}]},
            "local-path-shared": {"sharedFileSystemPath": "/every/node/shared"},
        },
    }
    upstream_config = upstream["ConfigMap", "local-path-config"]["data"]
    assert {k: v for k, v in config.items() if k != "config.json"} == {
        k: v for k, v in upstream_config.items() if k != "config.json"
    }
    del default["metadata"]["annotations"]
    for key, obj in upstream.items():
        if key != ("ConfigMap", "local-path-config"):
            assert objects[key] == obj, key
    # A manifest of another layout (a version bumped without looking) is refused, not half rendered into a class.
    other = tmp_path / "other.yaml"
    other.write_text(LOCAL_PATH_MANIFEST.read_text().replace("config.json: |-", "config.yaml: |-"))
    refused = render_local_path(other, "/node/storage", "/every/node/shared")
    assert refused.returncode == 1 and "check LOCAL_PATH_PROVISIONER_VERSION" in refused.stderr


def fake_local_path_zip(tmp_path: pathlib.Path) -> pathlib.Path:
    """local-path-provisioner's module zip as the Go module proxy lays it out, with its real deploy manifest."""
    import zipfile

    zip_path = tmp_path / "local-path.zip"
    version = settings_file()["LOCAL_PATH_PROVISIONER_VERSION"]
    with zipfile.ZipFile(zip_path, "w") as archive:
        where = f"github.com/rancher/local-path-provisioner@{version}/deploy/local-path-storage.yaml"
        archive.write(LOCAL_PATH_MANIFEST, where)
    return zip_path


def k3d_calls(tmp_path: pathlib.Path) -> list[list[str]]:
    import shlex

    log = tmp_path / "k3d.log"
    return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


def two_nodes(tmp_path: pathlib.Path, **environ: str):
    """k3d-up NODES=2 with the module zip's sha256 as recorded and the shared folder in TMP_PATH."""
    tmp_path.mkdir(exist_ok=True)
    zip_path = fake_local_path_zip(tmp_path)
    recorded = hashlib.sha256(zip_path.read_bytes()).hexdigest()
    environ = {
        "LOCAL_PATH_PROVISIONER_MODULE_ZIP_SHA256": recorded,
        "K3D_SHARED_DIR": str(tmp_path / "shared"),
        **environ,
    }
    return k3d_up_with(tmp_path / "run", "tfjob", local_path_zip=zip_path, NODES="2", **environ), recorded


# What k3d-up NODES=1 creates, as before NODES=2 existed.
ONE_NODE_CREATE = (
    "cluster create distml --image {K3S_IMAGE} --wait --kubeconfig-update-default --kubeconfig-switch-context=false"
)


def test_k3d_up_nodes_2_adds_an_agent_mounts_one_folder_on_every_node_and_offers_both_local_path_classes(tmp_path):
    (result, applies, applied), recorded = two_nodes(tmp_path)
    assert result.returncode == 0, result.stderr
    settings = settings_file()
    (create,) = [call for call in k3d_calls(tmp_path / "run") if call[:2] == ["cluster", "create"]]
    one_node = ONE_NODE_CREATE.format(**settings).split()
    assert create[: len(one_node)] == one_node
    options = dict(zip(create[len(one_node) :: 2], create[len(one_node) + 1 :: 2], strict=True))
    assert options["--agents"] == "1"
    assert options["--k3s-arg"] == "--disable=local-storage@server:*"  # k3s's own provisioner off
    assert options["--volume"].endswith("@all")  # every node, at one path
    folder, node_path = options["--volume"].removesuffix("@all").split(":")
    assert folder == str(tmp_path / "shared") and (tmp_path / "shared").is_dir()
    # The storage first, from the checked module zip, then the engine.
    version = settings["LOCAL_PATH_PROVISIONER_VERSION"]
    url = f"https://proxy.golang.org/github.com/rancher/local-path-provisioner/@v/{version}.zip"
    assert f"checked {url}: sha256 {recorded}" in result.stdout
    downloads = (tmp_path / "run" / "curl.log").read_text().splitlines()
    assert len(downloads) == 1 and "scripts/cluster/checked-download.sh" in downloads[0] and url in downloads[0]
    assert [without_scratch(a) for a in applies][:2] == [
        "--context k3d-distml apply -f SCRATCH/local-path.yaml",
        f"--context k3d-distml apply --server-side -k github.com/kubeflow/trainer.git/manifests/overlays/standalone"
        f"?ref={settings['TRAINING_OPERATOR_COMMIT']}",
    ]
    manifest = (applied / "local-path.yaml").read_text()
    assert manifest == render_local_path(LOCAL_PATH_MANIFEST, "/var/lib/rancher/k3s/storage", node_path).stdout
    objects = local_path_objects(manifest)
    assert {name for kind, name in objects if kind == "StorageClass"} == {"local-path", "local-path-shared"}
    config = json.loads(objects["ConfigMap", "local-path-config"]["data"]["config.json"])
    assert config["storageClassConfigs"]["local-path-shared"] == {"sharedFileSystemPath": node_path}
    assert "rollout status deployment/local-path-provisioner" in (tmp_path / "run" / "kubectl.log").read_text()
    assert "VOLUME_ACCESS_MODE=ReadWriteMany VOLUME_STORAGE_CLASS=local-path-shared" in result.stdout


def test_k3d_up_nodes_2_applies_no_provisioner_whose_zip_is_not_the_recorded_one(tmp_path):
    (result, applies, _), recorded = two_nodes(tmp_path, LOCAL_PATH_PROVISIONER_MODULE_ZIP_SHA256="0" * 64)
    assert result.returncode == 2 and f"has sha256 {recorded}, not the recorded" in result.stderr
    assert applies == []  # nothing after it either: no engine on a cluster whose storage is not in


def test_k3d_up_nodes_2_defaults_its_shared_folder_to_one_under_home_and_k3d_down_names_it(tmp_path):
    home = tmp_path / "home"
    (result, _, _), _ = two_nodes(tmp_path, HOME=str(home), K3D_SHARED_DIR="")
    assert result.returncode == 0, result.stderr
    folder = home / ".local" / "share" / "distml" / "k3d-distml-shared"
    (create,) = [call for call in k3d_calls(tmp_path / "run") if call[:2] == ["cluster", "create"]]
    assert f"{folder}:" in create[create.index("--volume") + 1] and folder.is_dir()
    (tmp_path / "down").mkdir()
    stubs = path_with(tmp_path / "down", {"k3d": "exit 0"})
    down = run_script(CLUSTER_SCRIPTS / "k3d-down.sh", stubs, HOME=str(home))
    assert down.returncode == 0, down.stderr
    assert f"the shared folder {folder} (" in down.stdout and folder.is_dir()  # named, not deleted


@pytest.mark.parametrize("nodes", ["0", "3", "two"])
def test_k3d_up_refuses_a_node_count_it_cannot_make_before_creating_anything(tmp_path, nodes):
    result, applies, _ = k3d_up_with(tmp_path, "tfjob", NODES=nodes)
    assert result.returncode == 2
    assert f"error: NODES={nodes} is not 1 or 2: the k3d cluster has its server node and at most one agent" in (
        result.stderr
    )
    assert k3d_calls(tmp_path) == [] and applies == []


@pytest.mark.parametrize("nodes", [None, "1"])
def test_k3d_up_with_one_node_creates_the_cluster_as_before_nodes_2_existed(tmp_path, nodes):
    home = tmp_path / "home"
    environ = {"HOME": str(home)} if nodes is None else {"HOME": str(home), "NODES": nodes}
    result, applies, _ = k3d_up_with(tmp_path, "tfjob", **environ)
    assert result.returncode == 0, result.stderr
    settings = settings_file()
    creates = [call for call in k3d_calls(tmp_path) if call[:2] == ["cluster", "create"]]
    assert creates == [ONE_NODE_CREATE.format(**settings).split()]
    assert f"creating cluster distml with {settings['K3S_IMAGE']}\n" in result.stdout
    assert [a for a in applies if "local-path" in a] == [] and not (tmp_path / "curl.log").exists()
    assert not home.exists()  # no shared folder
    assert "ready: make submit ENGINE=tfjob\n" in result.stdout


def test_k3d_up_nodes_2_refuses_a_one_node_cluster_and_renews_the_storage_of_a_two_node_one(tmp_path):
    (refused, applies, _), _ = two_nodes(tmp_path / "a", servers="1/1", node_mounts="/var/lib/rancher/k3s")
    assert refused.returncode == 1 and applies == []
    assert "make k3d-down, then make k3d-up NODES=2" in refused.stderr
    (again, applies, _), _ = two_nodes(tmp_path / "b", servers="1/1", node_mounts="/var/lib/distml-shared /var/log")
    assert again.returncode == 0, again.stderr
    assert not [call for call in k3d_calls(tmp_path / "b" / "run") if call[:2] == ["cluster", "create"]]
    assert without_scratch(applies[0]) == "--context k3d-distml apply -f SCRATCH/local-path.yaml"


@engines_here.needs("jobset", "trainjob")
def test_k3d_up_refuses_trainer_beside_a_standalone_jobset_and_an_unknown_engine(tmp_path):
    result, applies, _ = k3d_up_with(tmp_path / "a", "trainjob", standalone_jobset=True)
    assert result.returncode == 1 and applies == []
    assert "would install a second JobSet controller" in result.stderr and "delete -k" in result.stderr
    result, _, _ = k3d_up_with(tmp_path / "b", "volcano")
    assert result.returncode == 2 and "ENGINE=volcano is not an engine" in result.stderr


@pytest.mark.parametrize("script, missing", [("k3d-down.sh", "k3d"), ("fetch-model.sh", "kubectl")])
def test_other_scripts_say_which_tool_is_missing(tmp_path, script, missing):
    result = run_script(CLUSTER_SCRIPTS / script, path_with(tmp_path, {}))
    assert result.returncode == 1
    assert f"{missing} is not installed" in result.stderr


@pytest.mark.image
def test_a_buildah_image_reaches_k3d_under_the_name_pods_ask_for(tmp_path):
    # k3d itself is a recording stub here: the check is the archive it is handed, not a cluster.
    from scripts.cluster import steps as cluster_steps

    assert shutil.which("buildah"), "buildah is missing: apt-get install buildah (Debian/Ubuntu)"
    storage = tmp_path / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path}/graph"\nrunroot = "{tmp_path}/run"\n')
    recorded = tmp_path / "k3d-saw.json"
    stubs = path_with(
        tmp_path, {"k3d": f'{shutil.which("tar")} -xOf "$3" manifest.json > {recorded}; echo "$@" >> {recorded}.args'}
    )
    env = {"CONTAINERS_STORAGE_CONF": str(storage), "BUILDAH_ISOLATION": "chroot"}
    buildah = [shutil.which("buildah")]
    run_env = dict(os.environ, **env)
    container = subprocess.run(
        [*buildah, "from", "scratch"], env=run_env, capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(
        [*buildah, "commit", "-q", container, "tf-multiworker-trainer:rev123"],
        env=run_env,
        check=True,
        capture_output=True,
    )
    old_path = os.environ["PATH"]
    os.environ.update(env, PATH=f"{stubs}:{old_path}")
    try:
        cluster_steps.import_image("tf-multiworker-trainer:rev123", "distml", "buildah")
    finally:
        os.environ["PATH"] = old_path
        for key in env:
            os.environ.pop(key)
    (manifest,) = json.loads(recorded.read_text())
    assert "docker.io/library/tf-multiworker-trainer:rev123" in manifest["RepoTags"]
    assert "--cluster distml" in (tmp_path / "k3d-saw.json.args").read_text()


def test_build_image_reports_the_size_when_the_tool_lists_many_lines(tmp_path):
    # `images | head -n 1` under pipefail failed with 141 (SIGPIPE) after a good build when the list was long.
    docker = "if [[ $1 == images ]]; then for ((i = 0; i < 200000; i++)); do echo 1.7GB; done; fi; exit 0"
    stubs = path_with(tmp_path, {"docker": docker})
    result = subprocess.run(
        [shutil.which("bash"), str(ROOT / "scripts" / "image" / "build-image.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={
            **os.environ,
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "CONTAINER_TOOL": "docker",
            "BASE_IMAGE_DIGEST": "sha256:" + "0" * 64,
        },
    )
    assert result.returncode == 0, result.stderr
    assert "size 1.7GB (uncompressed)" in result.stdout


def test_make_help_lists_each_target_by_name():
    result = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert {"help", "run-local", "test", "submit", "k3d-up"} <= set(names), result.stdout


def test_the_local_nodes_import_an_image_once_from_one_archive_and_label_it_with_the_local_image_s_id(monkeypatch):
    from scripts.cluster import steps

    node_images: dict[str, dict[str, str]] = {}  # socket -> name -> the id label, as each node's containerd holds them
    commands: list[list[str]] = []

    def run(command, stdin=None, check=True, quiet=False):
        commands.append(command)
        stdout = ""
        socket = command[2] if command[0] == "ctr" else ""
        held = node_images.setdefault(socket, {})
        if command[:2] == ["buildah", "inspect"]:
            stdout = "sha256:1234abcd\n"
        elif command[-3:-1] == ["images", "ls"] or command[-4:-2] == ["images", "ls"]:
            wanted = command[-1]
            stdout = "".join(f"{name}\n" for name, label in held.items() if f"=={name}," in wanted and label in wanted)
        elif "label" in command:
            name, label = command[-2], command[-1].split("=", 1)[1]
            held[name] = label
        return subprocess.CompletedProcess(command, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(steps, "run", run)
    steps.import_image_to_node("trainer:abc", "buildah", ["/run/node.sock"])
    imports = [c for c in commands if "import" in c]
    assert len(imports) == 1 and node_images["/run/node.sock"] == {"docker.io/library/trainer:abc": "sha256:1234abcd"}
    steps.import_image_to_node("trainer:abc", "buildah", ["/run/node.sock"])
    assert len([c for c in commands if "import" in c]) == 1, "the same image is not copied twice"

    # A second node (make cluster-up NODES=2): only it gets the image, from one archive.
    commands.clear()
    steps.import_image_to_node("trainer:abc", "buildah", ["/run/node.sock", "/run/agent/node.sock"])
    assert [c[2] for c in commands if "import" in c] == ["/run/agent/node.sock"]
    assert len([c for c in commands if c[:2] == ["buildah", "push"]]) == 1
    assert node_images["/run/agent/node.sock"] == node_images["/run/node.sock"]

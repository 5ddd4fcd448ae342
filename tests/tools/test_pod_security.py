"""Secure by default on a shared cluster (docs/security.md): every pod the project makes (each engine's trainer pods,
the data Job, TensorBoard, the fetch-model pod) meets the Pod Security Standard "restricted" as Kubernetes documents
it, runs with a read-only root, no service-account token and bounded resources; the NetworkPolicies admit the TF port
from the job's own pods only; the namespace example enforces restricted."""

from __future__ import annotations

import copy
import pathlib
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from pod_security import all_problems, restricted_problems
from scripts.common import manifest
from scripts.common import settings as project_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = project_settings.load()
K8S_VERSION = SETTINGS["K3S_IMAGE"].split(":v")[1].split("-")[0]
OVERLAYS = [(engine, strategy) for engine in manifest.ENGINES for strategy in manifest.STRATEGIES]
INSTANCE = "app.kubernetes.io/instance"


def pods_of(objects: list[dict]) -> list[tuple[str, dict]]:
    return [
        (f"{obj['kind']} {obj['metadata']['name']} pod {i}", template)
        for obj in objects
        for i, template in enumerate(manifest.pod_templates(obj))
    ]


@pytest.mark.parametrize("engine, strategy", OVERLAYS)
def test_every_pod_of_every_overlay_meets_pss_restricted_and_the_projects_rules(rendered_overlays, engine, strategy):
    pods = pods_of(rendered_overlays[engine, strategy])
    kinds = {where.split()[0] for where, _ in pods}
    assert {"Job", "Deployment"} <= kinds and len(kinds) == 3  # the data Job, TensorBoard and the engine's pods
    problems = [f"{where}: {problem}" for where, template in pods for problem in all_problems(template["spec"])]
    assert problems == []


GOOD = {
    "automountServiceAccountToken": False,
    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "c",
            "image": "i",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "resources": {
                "requests": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
                "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
            },
        }
    ],
    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
}
BREACHES = {
    "allowPrivilegeEscalation is not false": lambda pod, c: c["securityContext"].pop("allowPrivilegeEscalation"),
    "capabilities.drop lacks ALL": lambda pod, c: c["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
    "capabilities.add ['SYS_ADMIN'] beyond baseline": lambda pod, c: c["securityContext"]["capabilities"].update(
        add=["SYS_ADMIN"]
    ),
    "capabilities.add ['CHOWN'] beyond restricted": lambda pod, c: c["securityContext"]["capabilities"].update(
        add=["CHOWN"]
    ),
    "runAsNonRoot is not true": lambda pod, c: pod["securityContext"].pop("runAsNonRoot"),
    "runAsUser is 0": lambda pod, c: c["securityContext"].update(runAsUser=0),
    "seccompProfile is unset": lambda pod, c: pod["securityContext"].pop("seccompProfile"),
    "seccompProfile is Unconfined": lambda pod, c: c["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    "privileged is true": lambda pod, c: c["securityContext"].update(privileged=True),
    "spec.hostNetwork is true": lambda pod, c: pod.update(hostNetwork=True),
    "is a hostPath": lambda pod, c: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    "['nfs'] not an allowed type": lambda pod, c: pod["volumes"].append({"name": "n", "nfs": {"server": "s"}}),
    "has hostPort 80": lambda pod, c: c.update(ports=[{"name": "p", "containerPort": 80, "hostPort": 80}]),
    "readOnlyRootFilesystem is not true": lambda pod, c: c["securityContext"].pop("readOnlyRootFilesystem"),
    "automountServiceAccountToken is not false": lambda pod, c: pod.pop("automountServiceAccountToken"),
    "resources.limits lacks ephemeral-storage": lambda pod, c: c["resources"]["limits"].pop("ephemeral-storage"),
    "emptyDir without sizeLimit": lambda pod, c: pod["volumes"][0].update(emptyDir={}),
}


def test_the_rules_pass_a_restricted_pod_and_the_pod_is_valid():
    assert all_problems(GOOD) == []
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": GOOD}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


@pytest.mark.parametrize("problem", BREACHES)
def test_the_rules_name_each_breach(problem):
    pod = copy.deepcopy(GOOD)
    BREACHES[problem](pod, pod["containers"][0])
    assert any(problem in line for line in all_problems(pod)), all_problems(pod)


def test_the_container_may_state_run_as_non_root_itself_but_never_undo_the_pods():
    pod = copy.deepcopy(GOOD)
    pod["containers"][0]["securityContext"]["runAsNonRoot"] = False
    assert any("runAsNonRoot is not true" in line for line in restricted_problems(pod))
    pod["securityContext"].pop("runAsNonRoot")
    pod["containers"][0]["securityContext"]["runAsNonRoot"] = True
    assert restricted_problems(pod) == []


def fetch_model_calls(tmp_path: pathlib.Path, environ: dict[str, str]) -> tuple[subprocess.CompletedProcess, list]:
    """fetch-model.sh against a recording kubectl (no cluster; the model is reported absent): its result, and each
    call's arguments with what it read on stdin."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    log.mkdir()
    stub = bin_dir / "kubectl"
    stub.write_text(
        f"#!{shutil.which('bash')}\n"
        f'n=$(ls {log} | wc -l); printf "%s\\n" "$@" > {log}/$n.args\n'
        f'if [[ " $* " == *" apply "* ]]; then cat > {log}/$n.stdin; fi\n'
        'if [[ " $* " == *" exec "* ]]; then exit 1; fi\n'
        "exit 0\n"
    )
    stub.chmod(0o755)
    python = bin_dir / "python3"
    python.write_text(f'#!{shutil.which("bash")}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    result = subprocess.run(
        [shutil.which("bash"), str(ROOT / "scripts" / "cluster" / "fetch-model.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "IMAGE": "img:1", **environ},
        timeout=60,
    )
    calls = []
    for args in sorted(log.glob("*.args"), key=lambda p: int(p.stem)):
        stdin = args.with_suffix(".stdin")
        calls.append((args.read_text().splitlines(), stdin.read_text() if stdin.exists() else None))
    return result, calls


def test_the_fetch_model_pod_is_restricted_and_every_call_names_the_k3d_context(tmp_path):
    result, calls = fetch_model_calls(tmp_path, {})
    assert result.returncode == 1 and "metrics.json" in result.stderr  # the stub has no model to copy
    applied = [yaml.safe_load(stdin) for _, stdin in calls if stdin is not None]
    (pod,) = applied
    assert pod["kind"] == "Pod"
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert all_problems(pod["spec"]) == []
    assert all(args[:2] == ["--context", f"k3d-{SETTINGS['CLUSTER_NAME']}"] for args, _ in calls), calls
    # It reads this job's model directory, the one the trainer's pods write.
    assert any(f"{SETTINGS['MODEL_ROOT']}/{SETTINGS['JOB_NAME']}/metrics.json" in args for args, _ in calls)


def test_fetch_model_uses_another_context_only_when_one_is_named(tmp_path):
    _, calls = fetch_model_calls(tmp_path, {"KUBE_CONTEXT": "team-cluster"})
    assert calls and all(args[:2] == ["--context", "team-cluster"] for args, _ in calls)


def test_fetch_model_refuses_an_unsafe_setting_before_any_kubectl_call(tmp_path):
    result, calls = fetch_model_calls(tmp_path, {"JOB_NAME": "x;id"})
    assert result.returncode == 2 and calls == []
    assert "setting JOB_NAME=" in result.stderr and "DNS label" in result.stderr


def test_the_namespace_example_enforces_restricted():
    namespace = yaml.safe_load((ROOT / "k8s" / "examples" / "namespace.yaml").read_text())
    kubernetes_validate.validate(namespace, K8S_VERSION, strict=True)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def policies(objects: list[dict]) -> dict[str, dict]:
    return {
        obj["metadata"]["labels"]["app.kubernetes.io/component"]: obj
        for obj in manifest.of_kind(objects, "NetworkPolicy")
    }


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())


@pytest.mark.parametrize("engine, strategy", OVERLAYS)
def test_the_tf_port_admits_only_the_jobs_own_pods_and_the_status_port_the_namespace(
    rendered_overlays, engine, strategy
):
    objects = rendered_overlays[engine, strategy]
    training = policies(objects)["training"]
    kubernetes_validate.validate(training, K8S_VERSION, strict=True)
    trainers = manifest.trainer_templates(objects)
    for template in trainers:  # every trainer pod is under the policy
        assert selects(training["spec"]["podSelector"], template["metadata"]["labels"])
    assert training["spec"]["podSelector"]["matchLabels"][INSTANCE] == SETTINGS["JOB_NAME"]
    assert training["spec"]["policyTypes"] == ["Ingress"]
    tf_rule, status_rule = training["spec"]["ingress"]
    assert tf_rule["ports"] == [{"protocol": "TCP", "port": int(SETTINGS["TFJOB_PORT"])}]
    (peers,) = tf_rule["from"]
    assert set(peers) == {"podSelector"}  # no namespaceSelector, no ipBlock: this namespace's pods only
    assert peers["podSelector"] == training["spec"]["podSelector"]
    another_job = {**trainers[0]["metadata"]["labels"], INSTANCE: "another-job"}
    assert not selects(peers["podSelector"], another_job)
    assert status_rule == {
        "from": [{"podSelector": {}}],
        "ports": [{"protocol": "TCP", "port": int(SETTINGS["TRAINER_STATUS_PORT"])}],
    }


def test_the_data_job_admits_nobody_and_tensorboard_its_namespace_on_its_port(rendered_overlays):
    objects = rendered_overlays["tfjob", "sync"]
    by_component = policies(objects)
    data, board = by_component["prepare-data"], by_component["tensorboard"]
    job = manifest.the_one(objects, "Job", component="prepare-data")
    assert selects(data["spec"]["podSelector"], job["spec"]["template"]["metadata"]["labels"])
    assert data["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in data["spec"]
    deployment = manifest.the_one(objects, "Deployment", component="tensorboard")
    assert selects(board["spec"]["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert board["spec"]["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 6006}]}]


# k3d's cluster list line for the existing cluster: its servers running/total.
K3D_BRANCHES = {"creates the cluster": None, "finds it running": "1/1", "finds it stopped": "0/1"}


@pytest.mark.parametrize("branch", K3D_BRANCHES)
def test_k3d_up_leaves_the_current_context_alone(tmp_path, branch):
    """k3d-up against a kubeconfig whose current context is the user's: k3d stands in as it behaves (create and
    kubeconfig merge add the cluster's context and switch to it unless told not to), kubectl's config commands are
    the real kubectl's on that kubeconfig, its other calls are recorded; whichever branch runs, the user's context
    is still current after it."""
    bin_dir, log, kubeconfig = tmp_path / "bin", tmp_path / "calls.log", tmp_path / ".kube" / "config"
    bin_dir.mkdir()
    real_kubectl = shutil.which("kubectl")
    context = f"k3d-{SETTINGS['CLUSTER_NAME']}"
    engine = "jobset" if "jobset" in manifest.ENGINES else manifest.ENGINES[0]  # a fork may have deleted it
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "ENGINE": engine}
    for command in (["set-context", "mine", "--cluster=theirs"], ["use-context", "mine"]):
        subprocess.run([real_kubectl, "config", *command], env=environ, check=True, capture_output=True)
    servers = K3D_BRANCHES[branch]
    joins_kubeconfig = (
        f"{real_kubectl} config set-context {context} >/dev/null; "
        f'[[ " $* " == *" --kubeconfig-switch-context=false "* ]] || {real_kubectl} config use-context {context}'
    )
    stubs = {
        "docker": "exit 0",
        "git": "exit 0",
        "k3d": (
            f'echo "k3d $*" >> {log}; case "$1 $2" in\n'
            f'  "cluster get") exit {1 if servers is None else 0};;\n'
            f'  "cluster list") echo "{SETTINGS["CLUSTER_NAME"]} {servers} 0/0 true";;\n'
            f'  "cluster create" | "kubeconfig merge") {joins_kubeconfig};;\n'
            "esac; exit 0"
        ),
        "kubectl": (
            f'echo "kubectl $*" >> {log}; [[ " $* " != *" config "* ]] || exec {real_kubectl} "$@"; '
            '[[ " $* " != *" get deployment "* ]] || exit 1; exit 0'
        ),
        "python3": f'exec {sys.executable} "$@"',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    result = subprocess.run(
        [shutil.which("bash"), str(ROOT / "scripts" / "cluster" / "k3d-up.sh")],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    k3d_calls = [call.split()[1:3] for call in calls if call.startswith("k3d ")]
    if servers is None:
        assert ["cluster", "create"] in k3d_calls and ["kubeconfig", "merge"] not in k3d_calls
    else:
        assert ["kubeconfig", "merge"] in k3d_calls and ["cluster", "create"] not in k3d_calls
        assert (["cluster", "start"] in k3d_calls) == (servers == "0/1")
    config = yaml.safe_load(kubeconfig.read_text())
    assert {entry["name"] for entry in config["contexts"]} == {"mine", context}  # the cluster's context joined
    assert config["current-context"] == "mine"
    kubectl_calls = [call.split()[1:] for call in calls if call.startswith("kubectl ")]
    assert kubectl_calls and all(call[:2] == ["--context", context] for call in kubectl_calls), kubectl_calls

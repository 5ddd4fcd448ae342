"""Runs the project's manifests on this machine: every pod of the training group a local process, under the
engine's rules: a TFJob with the TF_CONFIG, restarts, failure and success rules of the Kubeflow training operator
v1.9; a JobSet with JobSet v0.12's pod names, labels and hostnames, group restarts (failurePolicy) and
successPolicy; a TrainJob as the JobSet Kubeflow Trainer v2.3 makes of it and its runtime.

    python -m scripts.localrun.run_local --workers 2 --dataset synthetic --epochs 1 -- --train-examples 2048
    python -m scripts.localrun.run_local --kustomize k8s/engines/jobset/sync --dataset synthetic --epochs 1

Reads `kubectl kustomize k8s/engines/tfjob/sync` (or --kustomize DIR, or --manifest FILE), picks the TFJob,
JobSet or TrainJob, maps its volume to runs/<job-name>/, runs the data-preparation Job first for a dataset that
needs one, then the group. Exit code: 0 Succeeded (Completed), 1 Failed, 2 the manifests cannot run, 128+n stopped
by signal n.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys

from scripts.common import manifest as tfjob_manifest
from scripts.common.cli import image_dir_of, split_trainer_flags
from scripts.common.settings import LOCAL_RUNS

from . import manifests as manifest_io
from .batch_job import BatchJobRules
from .console import Console
from .engine_modules import local_run
from .envvars import Problems
from .operator_rules import Replica
from .podplan import Planner, ProcessPlan, settings_of
from .report import shown, summarize
from .supervisor import Rules, Supervisor
from .watchdog import Watchdog

SYNTHETIC = "synthetic"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.localrun.run_local",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is appended to the trainer's arguments in every replica. Exit code: 0 the job "
        "Succeeded, 1 it Failed, 2 the manifests cannot run, 130/143 stopped by SIGINT/SIGTERM.",
    )
    parser.add_argument("--workers", type=int, help="Worker replicas (default: the manifest's)")
    parser.add_argument("--dataset", help="dataset for the trainer and the data preparation (default: the manifest's)")
    parser.add_argument("--epochs", type=int, help="epochs (default: the manifest's)")
    parser.add_argument(
        "--kustomize",
        type=pathlib.Path,
        default=tfjob_manifest.K8S_DIR,
        help="kustomization to render with `kubectl kustomize`, e.g. k8s/engines/jobset/sync (default: %(default)s)",
    )
    parser.add_argument("--manifest", type=pathlib.Path, help="rendered YAML to run instead of rendering --kustomize")
    parser.add_argument(
        "--job-dir",
        type=pathlib.Path,
        help="local directory that stands in for the job's volume (default: runs/<job-name>)",
    )
    parser.add_argument("--clean", action="store_true", help="delete the job directory first (a fresh volume)")
    parser.add_argument("--skip-prepare", action="store_true", help="do not run the data-preparation Job")
    parser.add_argument("--images", help="a local image folder to train on where it is (--dataset image_folder)")
    ours, trainer_flags = split_trainer_flags(argv)
    args = parser.parse_args(ours)
    args.trainer_flags = trainer_flags
    args.image_dir = image_dir_of(parser, args.images)
    return args


def load(args: argparse.Namespace) -> manifest_io.Manifests:
    """The rendered objects with the command line applied by the same function `make submit` uses."""
    if args.manifest is not None:
        if not args.manifest.exists():
            raise manifest_io.ManifestError(f"--manifest {args.manifest}: no such file")
        source, text = str(args.manifest), args.manifest.read_text()
    else:
        source, text = f"kubectl kustomize {args.kustomize}", tfjob_manifest.render_text(args.kustomize)
    objects = manifest_io.load_text(text, source)
    if sum(obj.get("kind") in tfjob_manifest.ENGINE_KINDS for obj in objects) == 1:
        objects = tfjob_manifest.customize(
            objects,
            workers=args.workers,
            dataset=args.dataset,
            epochs=args.epochs,
            trainer_args=args.trainer_flags,
            dataset_options={"image-dir": args.image_dir} if args.image_dir else None,
        )
    return manifest_io.parse(objects, source)


def run_job(
    rules: Rules,
    processes: dict[str, tuple[Replica, ProcessPlan]],
    console: Console,
    watchdog: Watchdog,
    job_dir: pathlib.Path,
    model_dir: pathlib.Path | None,
) -> int:
    result = Supervisor(rules, processes, console, watchdog).run()
    return summarize(
        rules.kind,
        rules.namespace,
        rules.name,
        result,
        {n: r for n, (r, _) in processes.items()},
        console,
        model_dir,
        job_dir / "run-local" / f"{rules.name}.status.json",
    )


def preparations_to_run(preparations: list[ProcessPlan], dataset: str, args: argparse.Namespace) -> list[ProcessPlan]:
    """Like `make submit`: the data-preparation Job runs for every dataset but synthetic (it is a no-op when
    the data is already on the volume), unless --skip-prepare."""
    if dataset == SYNTHETIC or args.skip_prepare:
        return []
    return preparations


def clean(job_dir: pathlib.Path) -> None:
    """Deletes a job directory, but only one that run-local made (it holds run-local/)."""
    if not job_dir.exists():
        return
    if any(job_dir.iterdir()) and not (job_dir / "run-local").is_dir():
        raise manifest_io.ManifestError(
            f"--clean: {job_dir} was not made by run-local (it has no run-local/ "
            f"directory); delete it yourself if you mean it"
        )
    shutil.rmtree(job_dir)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    problems = Problems()
    try:
        manifests = load(args)
        job_dir = (args.job_dir or LOCAL_RUNS / manifests.name).resolve()
        if args.clean:
            clean(job_dir)
        planner = Planner(manifests, job_dir, problems)
        engine = local_run(manifests.kind)
        replicas, planned = engine.plan(planner)
        preparations = planner.preparation_jobs()
        if not problems.errors:
            chief_settings = settings_of(planner.chief)
            preparations = preparations_to_run(preparations, chief_settings.dataset, args)
    except manifest_io.ManifestError as error:
        print(f"run-local: {error}", file=sys.stderr)
        return 2
    for note in dict.fromkeys(problems.notes):
        print(f"run-local: note: {note}", file=sys.stderr)
    if problems.errors:
        for error in dict.fromkeys(problems.errors):
            print(f"run-local: error: {error}", file=sys.stderr)
        return 2

    chief = planner.chief
    console = Console([p.name for _, p in replicas] + [p.name for p in preparations], job_dir / "run-local" / "logs")
    watchdog = Watchdog(max(p.grace_s for _, p in replicas))
    try:
        if manifests.made_from is not None:
            console.say(local_run(manifests.made_from["kind"]).describe(manifests.made_from, manifests.job))
        console.say(
            f"{manifests.kind} {manifests.namespace}/{manifests.name}: {len(replicas)} "
            f"{getattr(engine, 'PROCESS_NOUN', 'pod')}(s); "
            f"volume {', '.join(sorted(planner.claims)) or '(none)'} -> {shown(job_dir)} "
            f"(kept between runs like the claim; --clean starts afresh)"
        )
        console.say(f"logs: {shown(console.log_dir)}/<replica>.log")
        for replica, plan in replicas:
            for port_name, (container_port, local) in plan.ports.items():
                console.say(f"{plan.name}: container port {port_name} ({container_port}) is 127.0.0.1:{local} here")
            if replica.restart_policy == "Always":
                console.say(
                    f"{plan.name}: restartPolicy Always restarts the replica even after exit 0, so the job "
                    f"can only end by backoffLimit or activeDeadlineSeconds, as on a cluster"
                )
        if args.skip_prepare:
            console.say(
                "--skip-prepare: the data-preparation Job does not run; the trainer reads what is on the volume"
            )
        for plan in preparations:
            preparation = BatchJobRules(plan.name, manifests.namespace)
            code = run_job(preparation, {plan.name: (preparation.replicas[0], plan)}, console, watchdog, job_dir, None)
            if code != 0:
                console.say(f"data preparation Job {plan.name} did not succeed; the {manifests.kind} is not started")
                return code
        rules: Rules = engine.rules(manifests, replicas, planned)
        model_dir = pathlib.Path(chief.cwd) / chief_settings.model_dir
        return run_job(rules, {p.name: (r, p) for r, p in replicas}, console, watchdog, job_dir, model_dir)
    finally:
        console.close()
        watchdog.close()


if __name__ == "__main__":
    sys.exit(main())

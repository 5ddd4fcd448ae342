"""`make tune`: a hyperparameter search with Optuna, each trial the real multi-worker job run by run-local.

    python -m scripts.tune.tune --search-space scripts/tune/search_space.yaml --study multi-worker-tune \\
        --workers 2 --dataset synthetic --epochs 3 -- --train-examples 4096

The search space (space.py) is checked against the trainer's options first. Trials run `parallel` at a time (at
most the cores / workers per trial), each under JOB_NAME <study>-<trial number>; a trial whose epoch's test figure
is below the median of earlier trials at that epoch is pruned; a failed one (exit 2, exit 4 on a non-finite loss) is
recorded with its reason and never chosen. The study lives in runs/<study>.study/ (study.journal, logs/, history.png):
Ctrl-C or a crash, then the same command, resumes it (finished trials stay, interrupted ones run again). At the end,
the table of trials, the picture of the objective over them, and the complete trials' models go through model
selection (`python -m trainer.serving.select`, as make select): the best is published into --publish-to, which
`make serve SERVE_FROM=<it>` serves.

Exit code: 0 a model was published, 1 no trial succeeded, 2 the search space or the flags cannot run, 130 stopped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time

import optuna
from optuna.storages import JournalStorage
from optuna.trial import TrialState

from scripts.common.cli import image_dir_of
from scripts.common.settings import SettingsError, load
from trainer.base.errors import UserError

from . import arguments
from . import space as spaces
from . import study as studies
from . import trial as trials

SIGNAL_CHECK_SECONDS = 0.5  # how long the main thread waits on trials before it looks for Ctrl-C again


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = arguments.study_parser("python -m scripts.tune.tune", __doc__, "tune")
    parser.add_argument(
        "--study", required=True, help="the study's name: runs/<study>.study/ holds it, trials are <study>-N"
    )
    parser.add_argument("--kustomize", default="k8s/engines/tfjob/sync", help="the overlay each trial runs")
    arguments.add_trial_shape(parser)
    parser.add_argument("--images", help="a local image folder every trial trains on where it is (IMAGES=)")
    parser.add_argument("--trials", type=int, help="the trial budget, over the file's trials: (TRIALS=)")
    parser.add_argument("--parallel", type=int, help="trials at once, over the file's parallel: (PARALLEL=)")
    parser.add_argument("--publish-to", required=True, help="the base path the best model is published into")
    parser.add_argument(
        "--replace", action="store_true", help="publish the best even where the published model is as good (REPLACE=)"
    )
    args = arguments.parse(parser, argv)
    args.image_dir = image_dir_of(parser, args.images)
    return args


def say(line: str) -> None:
    print(f"tune: {line}", flush=True)


def at_once(wanted: int, workers: int) -> int:
    """Trials at once: as many as asked, but no more than the cores hold at one core per worker."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    most = max(1, cores // workers)
    if wanted > most:
        say(f"{wanted} trials at once would put {wanted * workers} workers on {cores} cores; running {most} at once")
    return min(wanted, most)


@dataclasses.dataclass
class Search:
    """What every trial of one search shares."""

    study: optuna.Study
    storage: JournalStorage
    space: spaces.SearchSpace
    settings: dict[str, str]
    study_dir: pathlib.Path
    run_local_args: list[str]
    trainer_args: list[str]
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def run_one(self) -> None:
        """Asks the sampler for a trial, runs its job, tells the study how it ended, and says so in one line."""
        trial = self.study.ask()
        values = self.space.suggest(trial)
        job = trials.TrialJob.named(f"{self.study.study_name}-{trial.number}", self.settings, self.study_dir / "logs")
        trial.set_user_attr("job", job.job_name)
        trial.set_user_attr("model_dir", str(job.model_dir))
        shown = " ".join(f"{name}={studies.shown(value)}" for name, value in values.items())
        say(f"trial {trial.number} started: {shown} (log: {trials.shown(job.log)})")
        started = time.monotonic()
        key = self.space.objective.key

        def epoch_done(epoch: int, value: float) -> bool:
            trial.report(value, epoch)
            return self.space.prune and trial.should_prune()

        flags = [*self.trainer_args, *spaces.trainer_flags(values)]
        ending = trials.run(job, self.run_local_args, flags, key, epoch_done, self.stop)
        took = f"{time.monotonic() - started:.0f} s"
        if ending.value is not None:
            self.study.tell(trial, ending.value)
            best = self.study.best_trial
            say(
                f"trial {trial.number} complete in {took}: {key} {ending.value:.4g} "
                f"(best: trial {best.number}, {best.value:.4g})"
            )
        elif ending.pruned:
            trial.set_user_attr("reason", ending.reason)
            self.study.tell(trial, state=TrialState.PRUNED)
            say(f"trial {trial.number} {ending.reason}, in {took}")
        elif self.stop.is_set():
            studies.give_up(self.study, self.storage, trial.number, trial.params, ending.reason)
            say(f"trial {trial.number} stopped; it runs again when the study resumes")
        else:
            trial.set_user_attr("reason", ending.reason)
            self.study.tell(trial, state=TrialState.FAIL)
            say(f"trial {trial.number} failed in {took}: {ending.reason}")

    def run(self, budget: int, parallel: int) -> bool:
        """Runs trials until the budget is spent; False when stopped (Ctrl-C, SIGTERM) first."""
        for stale in studies.resume(self.study, self.storage):
            say(f"trial {stale.number} was running when the tuner ended; it is marked failed and runs again")
        remaining = budget - studies.counted(self.study)
        say(
            f"study {self.study.study_name}: {max(remaining, 0)} of {budget} trials to run, {parallel} at a time "
            f"({self.space.sampler} sampler{', pruning' if self.space.prune else ''}); "
            f"{trials.shown(self.study_dir)}/study.journal keeps it"
        )
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            running: set[concurrent.futures.Future] = set()
            try:
                while remaining > 0 or running:
                    while remaining > 0 and len(running) < parallel:
                        running.add(pool.submit(self.run_one))
                        remaining -= 1
                    # In slices: the kernel may hand Ctrl-C to a trial's thread, and Python raises it only in the
                    # main thread, when that thread next runs; an unbounded wait would hold it until a trial ends.
                    done, running = concurrent.futures.wait(
                        running, timeout=SIGNAL_CHECK_SECONDS, return_when=concurrent.futures.FIRST_COMPLETED
                    )
                    for future in done:
                        future.result()  # a bug in the tuner ends it, with its traceback
            except KeyboardInterrupt:
                self.stop.set()  # each trial stops its job and is queued again
                concurrent.futures.wait(running)
                return False
        return True


def publish(model_dirs: list[str], publish_to: str, replace: bool) -> dict | None:
    """Model selection's decision over the model dirs, the winner published into publish_to unless the model
    published there is as good (or replace); None when it refused (its reason already printed). A command, not an
    import: the serving room stays deletable."""
    if importlib.util.find_spec("trainer.serving") is None:
        say("trainer/serving/ (model selection) is deleted from this project: nothing is published")
        return None
    command = [sys.executable, "-m", "trainer.serving.select", "--json", *(["--replace"] if replace else [])]
    command += ["--base-path", publish_to, "--candidates"]
    selected = subprocess.run([*command, *model_dirs], stdout=subprocess.PIPE, text=True)
    if selected.returncode != 0:
        say(f"model selection refused to publish (exit {selected.returncode}); the trials' models stay where they are")
        return None
    return json.loads(selected.stdout)


def finish(search: Search, publish_to: str, replace: bool = False) -> int:
    """The table, the picture, and the best complete trial published by model selection."""
    study = search.study
    print(studies.table(study, search.space), flush=True)
    picture = studies.picture(study, search.space.objective.key, search.study_dir / "history.png")
    if picture is not None:
        say(f"{search.space.objective.key} over trials: {trials.shown(picture)}")
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        say("no trial succeeded, so nothing is published; the reasons are in the table above")
        return 1
    decision = publish([trial.user_attrs["model_dir"] for trial in complete], publish_to, replace)
    if decision is None:
        return 1
    winner = next(trial for trial in complete if trial.user_attrs["model_dir"] == decision["winner"])
    best = (
        f"best: trial {winner.number} ({' '.join(f'{k}={studies.shown(v)}' for k, v in winner.params.items())}), "
        f"{search.space.objective.key} {winner.value:.4g}"
    )
    if decision["kept"]:
        say(f"{best}; not published: {decision['kept']}")
    else:
        # Plain make serve serves the newer of this and the last run-local's model, so the line names the folder.
        say(f"{best}; published as {decision['published']}: make serve SERVE_FROM={shlex.quote(publish_to)} serves it")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # SIGTERM (a closed terminal, a CI timeout) stops the search as Ctrl-C does: trials stopped and queued again.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    every_trial = [*arguments.dataset_flags(args), "--epochs", str(args.epochs)]
    every_trial += ["--image-dir", args.image_dir] if args.image_dir else []
    try:
        settings = load()
        space = spaces.load(args.search_space, [*args.trainer_flags, *every_trial], data_here=True)
        space = dataclasses.replace(space, trials=args.trials or space.trials, parallel=args.parallel or space.parallel)
        study_dir = studies.study_dir(args.study)
        run_local_args = ["--kustomize", args.kustomize, "--workers", str(args.workers)]
        run_local_args += [*arguments.dataset_flags(args), "--epochs", str(args.epochs)]
        run_local_args += ["--images", args.image_dir] if args.image_dir else []
        with studies.locked(study_dir):
            shared = [*run_local_args, *args.trainer_flags]
            study, storage = studies.open_study(study_dir, args.study, space, shared, say)
            search = Search(study, storage, space, settings, study_dir, run_local_args, args.trainer_flags)
            budget = space.trials
            if space.sampler == "grid" and len(space.grid_points()) < budget:
                budget = len(space.grid_points())
                say(f"the grid has {budget} combinations: {budget} trials in all")
            if not search.run(budget, at_once(space.parallel, args.workers)):
                say("stopped; the same command resumes the study (finished trials stay, stopped ones run again)")
                return 130
            return finish(search, args.publish_to, args.replace)
    except (UserError, SettingsError) as error:
        print(f"tune: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

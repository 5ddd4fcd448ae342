"""The Optuna study on disk: runs/<study>.study/study.journal (Optuna's append-only journal, which a crash cannot leave
half-written), one tuner at a time on it, a resumed study's interrupted trials failed and queued again, and what a
user reads at the end: the table of trials and the picture of the objective over them.
"""

from __future__ import annotations

import contextlib
import fcntl
import pathlib
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from scripts.common.settings import LOCAL_RUNS, rule_of

from .space import SEED_RANGE, SearchSpace, SpaceError

INTERRUPTED = "interrupted"  # the user attribute of a trial the tuner stopped or died during; it is run again
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
COMPARED = (TrialState.COMPLETE, TrialState.PRUNED)  # the trials with figures a later trial is compared with
NOTE_WIDTH = 100


def study_dir(name: str) -> pathlib.Path:
    """Where a study lives: runs/<name>.study/, a folder no job's can be (a job name has no dot), so neither
    run-local's CLEAN=1 nor a job named as the study can reach it."""
    pattern, allowed = rule_of("JOB_NAME")
    if not re.fullmatch(pattern, name):
        raise SpaceError(f"STUDY={name!r}: a study is named as a job is ({allowed}), its trials <study>-<n>")
    return LOCAL_RUNS / f"{name}.study"


@contextlib.contextmanager
def locked(study_dir: pathlib.Path) -> Iterator[None]:
    """One tuner per study: a second one would take the first one's running trials for interrupted ones."""
    study_dir.mkdir(parents=True, exist_ok=True)
    with open(study_dir / "tune.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpaceError(
                f"another make tune is running the study in {study_dir}; wait for it, or give this one STUDY="
            ) from None
        yield


def open_study(
    study_dir: pathlib.Path, name: str, space: SearchSpace, shared: list[str], say: Callable[[str], None]
) -> tuple[optuna.Study, JournalStorage]:
    """The study, new or resumed, and its storage. A resumed study must search the same space toward the same
    objective with the same flags for every trial (SHARED: the workers, dataset, epochs, image folder and ARGS), or
    its trials would not compare. One with no trial to compare with starts again (said by SAY): with new settings, or
    with the same ones where trials failed (the budget runs again once their cause is fixed); one whose only trials
    were interrupted resumes, running them again."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tuner prints its own line per trial
    study_dir.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(study_dir / "study.journal")))
    study = _create(storage, name, space)
    made_from, made_with = study.user_attrs.get("search_space"), study.user_attrs.get("shared_flags")
    changed = None
    if made_from is not None and made_from != space.digest:
        changed = f"was made from another search space or objective than {space.path}"
    elif made_with is not None and made_with != shared:
        changed = f"ran its trials with {' '.join(made_with)}, not {' '.join(shared)}"
    # With nothing to keep, failed trials would only eat the budget of a rerun after the user fixed their cause.
    if not study.get_trials(deepcopy=False, states=COMPARED) and (changed or counted(study)):
        failed = len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        said = f"the study in {study_dir} {changed}, but none" if changed else f"the study in {study_dir}: none"
        say(
            f"{said} of its trials completed or was pruned ({failed} failed), so it has nothing to compare with: "
            f"it starts again with these settings"
        )
        optuna.delete_study(study_name=name, storage=storage)
        study, changed = _create(storage, name, space), None
    if changed:
        raise SpaceError(
            f"the study in {study_dir} {changed}: its trials would not compare; give this search its own STUDY=, "
            f"run it with the same search space, ENGINE, STRATEGY, WORKERS, DATASET, EPOCHS, IMAGES and ARGS, or "
            f"delete {study_dir} to start over"
        )
    study.set_user_attr("search_space", space.digest)
    study.set_user_attr("shared_flags", shared)
    study.sampler = sampler(space, len(study.trials))
    for point in space.grid_points() if space.sampler == "grid" else ():
        study.enqueue_trial(point, skip_if_exists=True)  # a resumed grid queues only what it has not run
    return study, storage


def _create(storage: JournalStorage, name: str, space: SearchSpace) -> optuna.Study:
    return optuna.create_study(
        storage=storage,
        study_name=name,
        direction=space.direction,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2) if space.prune else optuna.pruners.NopPruner(),
        load_if_exists=True,
    )


def sampler(space: SearchSpace, trials_so_far: int = 0) -> optuna.samplers.BaseSampler:
    """The search's sampler, its seed moved on by the trials already run, so a resumed study does not draw its
    first trials again. A grid is every combination queued once (open_study) and taken in turn: Optuna's
    GridSampler ends a study from inside tell(), which only its optimize() loop allows."""
    seed = None if space.seed is None else (space.seed + trials_so_far) % SEED_RANGE
    if space.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def give_up(study: optuna.Study, storage: JournalStorage, number: int, params: dict[str, Any], reason: str) -> None:
    """Fails a running trial the tuner will not finish, with its reason, and queues its parameters to run again."""
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    storage.set_trial_user_attr(trial_id, "reason", reason)
    storage.set_trial_user_attr(trial_id, INTERRUPTED, True)
    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    study.enqueue_trial(params, user_attrs={"retry_of": number})


def resume(study: optuna.Study, storage: JournalStorage) -> list[FrozenTrial]:
    """Trials left running by a tuner that died (killed, crashed, the machine restarted): failed and queued again."""
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        give_up(study, storage, trial.number, trial.params, "interrupted: the tuner ended during this trial")
    return stale


def counted(study: optuna.Study) -> int:
    """Trials that count against the budget: finished ones, but not those interrupted (they run again)."""
    return sum(
        1 for trial in study.get_trials(deepcopy=False, states=FINISHED) if not trial.user_attrs.get(INTERRUPTED)
    )


def table(study: optuna.Study, space: SearchSpace) -> str:
    """Every trial: its parameters, objective value, state, time and reason, best first among the complete ones."""
    names = [parameter.name for parameter in space.parameters]
    header = ["trial", *names, space.objective.key, "state", "seconds", "note"]
    rows = [header]
    for trial in study.get_trials(deepcopy=False):
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else None
        note = str(trial.user_attrs.get("reason", ""))
        note = note if len(note) <= NOTE_WIDTH else note[: NOTE_WIDTH - 3] + "..."  # its trial's line says it whole
        if "retry_of" in trial.user_attrs:
            note = f"retry of trial {trial.user_attrs['retry_of']}" + (f"; {note}" if note else "")
        rows.append(
            [
                str(trial.number),
                *(shown(trial.params.get(name)) for name in names),
                shown(trial.value),
                trial.state.name.lower(),
                f"{seconds:.0f}" if seconds is not None else "",
                note,
            ]
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    lines = (
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows
    )
    return "\n".join(line.rstrip() for line in lines)


def picture(study: optuna.Study, objective_key: str, path: pathlib.Path) -> pathlib.Path | None:
    """The objective of each complete trial and the best so far (Optuna's optimization history), as a PNG."""
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    from optuna.visualization.matplotlib import plot_optimization_history

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = plot_optimization_history(study, target_name=objective_key)
    axes.set_title(f"{study.study_name}: {objective_key} over trials")
    axes.figure.savefig(path, dpi=100, bbox_inches="tight")
    return path


def shown(value: Any) -> str:
    """A parameter or objective value in a line or the table."""
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)

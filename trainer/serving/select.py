"""Model selection (`python -m trainer.serving.select`, make select): the best of several trained model dirs by the
task's declared objective, published into a served base path under a version higher than any there.

Each candidate is judged from its own metrics.json (trainer/artifacts/layout.py, written last by a finished run):
refused when its run did not finish, when the objective's metric is missing or not finite, when its setup differs
from the reference's, the first candidate that passes every other check (another task, or another test split: the
numbers would not compare), or when its export was not checked (metrics.json "export_check": {"passed": true, ...}).
The winner is then held against the model the base path already serves, as selection.json records it (`served`):
it is published only when it scores better on the same objective and the same test data; an equal score, a worse
one, or one tested on other data keeps the served model, and the decision says why (`kept`). `--replace` publishes
the winner all the same. A base path whose newest version no selection recorded (copied in by hand) is published over.
The winner's newest SavedModel is copied beside the base path's versions and renamed into place, so a server watching
the base path sees the whole version or none of it. selection.json, beside the base path, records the decision;
running again with no new result changes nothing, and ties go to the candidate listed first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import trainer.tasks  # noqa: F401 (registers the built-in tasks, whose objectives a candidate may name)
from trainer.artifacts.layout import METRICS, STATUS, ModelDir, numbered_versions
from trainer.base.atomic_file import copy_tree_to_first_free_number, write_json
from trainer.base.errors import ExitCode, SelectionError, UserError
from trainer.settings.config import URL_SCHEME
from trainer.settings.options import import_registering_module
from trainer.task import Objective, find

SELECTION = "selection.json"
SELECTION_LOCK = ".selection.lock"  # beside selection.json: held over a whole selection
RECORD_FIX = (
    "it records which published model a winner must beat; restore or delete it (deleting it publishes the next "
    "winner whatever it scores), or pass --replace (REPLACE=1) to publish the winner all the same"
)
# What makes two candidates' test figures comparable: the same task on the same test split.
SETUP_KEYS = ("task", "module", "dataset", "dataset_module", "test_files", "test_examples")
# Generated datasets (synthetic, or one a --dataset-module registers) derive their test split from the seed too.
GENERATED_SETUP_KEYS = ("seed",)
# An image folder's test split is its test/ folder, else a seeded share of train/.
HELD_OUT_SETUP_KEYS = ("validation_split", "seed")


@dataclasses.dataclass
class Candidate:
    model_dir: str
    metric: str | None = None
    value: float | None = None
    refused: str | None = None
    record: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def summary(self) -> dict[str, Any]:
        return {"model_dir": self.model_dir, "metric": self.metric, "value": self.value, "refused": self.refused}


def read_record(model_dir: str) -> tuple[dict[str, Any] | None, str | None]:
    """metrics.json of a finished run, or the reason there is none."""
    path = ModelDir(model_dir).metrics
    if not os.path.isdir(model_dir):
        return None, f"{model_dir} does not exist"
    if not os.path.exists(path):
        return None, f"the run did not finish: no {METRICS} in {model_dir}"
    try:
        with open(path) as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        return None, f"{path} is unreadable ({error})"
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        return None, f"{path} is not a trainer's {METRICS} (no config)"
    state = run_state(model_dir)
    if state not in (None, "succeeded"):
        # metrics.json of an earlier finish, while the dir is being trained again (or that run failed)
        return None, f"the run did not finish: {STATUS} says {state!r}"
    return record, None


def run_state(model_dir: str) -> str | None:
    """The chief's last recorded state (status.json), None where it wrote none."""
    try:
        with open(ModelDir(model_dir).status) as handle:
            status = json.load(handle)
    except (OSError, ValueError):
        return None
    return status.get("state") if isinstance(status, dict) else None


def setup_of(record: dict[str, Any]) -> dict[str, Any]:
    config = record["config"]
    setup = {key: config.get(key) for key in SETUP_KEYS}
    setup["module"] = setup["module"] or ""  # a run from before --module existed had none
    if config.get("dataset") == "synthetic" or config.get("dataset_module") or config.get("module"):
        setup.update({key: config.get(key) for key in GENERATED_SETUP_KEYS})
    if config.get("dataset") == "image_folder":
        image_dir = os.path.abspath(os.path.expanduser(str(config.get("image_dir") or "")))
        setup["image_dir"] = image_dir
        if not os.path.isdir(os.path.join(image_dir, "test")):
            setup.update({key: config.get(key) for key in HELD_OUT_SETUP_KEYS})
    setup["class_names"] = record.get("class_names")
    setup["evaluated_test_examples"] = record.get("test_examples")
    return setup


def objective_of(record: dict[str, Any]) -> Objective:
    """The objective the candidate's own task declares (its module imported, as the trainer did)."""
    config = record["config"]
    import_registering_module(str(config.get("module") or ""), "--module")  # none before --module existed
    return find(str(config.get("task", "")), str(config.get("task_module") or "")).objective


def setup_differences(record: dict[str, Any], reference: dict[str, Any], whose: str) -> str | None:
    """Why a candidate's figures do not compare with the reference's (another task or test split), or None."""
    differences = [
        f"{key} {value!r} ({whose}: {reference.get(key)!r})"
        for key, value in setup_of(record).items()
        if value != reference.get(key)
    ]
    return f"its setup differs: {'; '.join(differences)}" if differences else None


def judge(candidate: Candidate, objective: Objective) -> None:
    """Sets candidate.value, or candidate.refused with the reason: the checks of a candidate on its own."""
    record = candidate.record
    value = record.get(objective.key)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        candidate.refused = f"{objective.key} is missing or not finite ({value!r})"
        return
    check = record.get("export_check")
    if not isinstance(check, dict) or check.get("passed") is not True:
        candidate.refused = (
            f'its export was not checked or failed the check ({METRICS} "export_check": {check!r}): serving it '
            f"could answer differently from the model that was evaluated"
        )
        return
    try:
        exported = ModelDir(candidate.model_dir).latest_saved_model()
    except (FileNotFoundError, ValueError) as error:
        candidate.refused = f"no exported SavedModel ({error})"
        return
    # The trainer names a version by the global step of its weights: the newest must be the evaluated one.
    steps = record.get("steps")
    if isinstance(steps, int) and os.path.basename(exported) != str(steps):
        candidate.refused = (
            f"its newest SavedModel ({exported}) is not the one evaluated at step {steps}: a later run exported "
            f"without finishing, or the version was copied in by hand"
        )
        return
    candidate.value = float(value)


def choose(
    model_dirs: list[str], served_setup: dict[str, Any] | None = None
) -> tuple[list[Candidate], Candidate | None, Objective | None]:
    """Every candidate judged, and the winner (ties: the first listed). The reference setup, which every other
    candidate must share, is the served model's where a candidate that passes shares it, else the first candidate's
    that passes on its own (a refused one, an old run, sets no setup for the rest)."""
    candidates = [Candidate(model_dir) for model_dir in model_dirs]
    readable, objectives = [], {}
    for candidate in candidates:
        record, problem = read_record(candidate.model_dir)
        if record is None:
            candidate.refused = problem
            continue
        candidate.record = record
        try:
            objectives[candidate.model_dir] = objective = objective_of(record)
        except UserError as error:
            candidate.refused = f"its task cannot be found ({error})"
            continue
        candidate.metric = objective.key
        judge(candidate, objective)
        readable.append(candidate)
    passing = [candidate for candidate in readable if candidate.refused is None]
    if not passing:
        return candidates, None, None
    like_served = [c for c in passing if served_setup is not None and setup_of(c.record) == served_setup]
    reference = (like_served or passing)[0]
    setup, whose = (
        setup_of(reference.record),
        "the served model's" if like_served else ("the reference's, the first candidate that passes"),
    )
    for at, candidate in enumerate(readable):
        # Before the reference, a candidate refused on its own keeps its reason; after it, the setup is checked first.
        if candidate is reference or (candidate.refused and at < readable.index(reference)):
            continue
        candidate.refused = setup_differences(candidate.record, setup, whose) or candidate.refused
    objective = objectives[reference.model_dir]
    accepted = [candidate for candidate in candidates if candidate.refused is None and candidate.value is not None]
    sign = -1.0 if objective.higher_is_better else 1.0
    winner = min(accepted, key=lambda candidate: sign * (candidate.value or 0.0))  # min keeps the first of equals
    return candidates, winner, objective


def selection_path(base_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(base_path)), SELECTION)


def previous_selection(base_path: str) -> dict[str, Any] | None:
    """selection.json as the last selection into this folder wrote it; None where there is none. Raises
    SelectionError for one that cannot be read: the record of what is served is not to be guessed."""
    path = selection_path(base_path)
    try:
        with open(path) as handle:
            previous = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise SelectionError(f"{path} cannot be read ({error}): {RECORD_FIX}") from None
    if not isinstance(previous, dict):
        raise SelectionError(f"{path} is not a selection's record (not a JSON object): {RECORD_FIX}")
    return previous


@contextlib.contextmanager
def selection_lock(base_path: str) -> Iterator[None]:
    """Held from reading selection.json to writing it: two selections into one base path take turns, so each
    publishes its own version and the record names the last one published."""
    directory = os.path.dirname(selection_path(base_path))
    try:
        os.makedirs(directory, exist_ok=True)
        handle = open(os.path.join(directory, SELECTION_LOCK), "a")
    except OSError as error:
        raise SelectionError(
            f"cannot lock {directory} for the selection ({error.strerror}): give a writable base path"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def publish(winner: Candidate, base_path: str) -> str:
    """Copies the winner's newest SavedModel to base_path/<highest + 1> (the next free number, reserved as it is
    renamed into place); returns the folder."""
    source = ModelDir(winner.model_dir).latest_saved_model()
    try:
        return copy_tree_to_first_free_number(source, base_path, max(numbered_versions(base_path), default=0) + 1)
    except OSError as error:
        raise SelectionError(
            f"cannot publish {source} into {base_path} ({error.strerror}): give a writable base path"
        ) from None


def served_record(winner: Candidate, objective: Objective, base_path: str, published: str) -> dict[str, Any]:
    """What selection.json keeps of the model it publishes, so the next selection can be held against it."""
    return {
        "model_dir": winner.model_dir,
        "metric": objective.key,
        "higher_is_better": objective.higher_is_better,
        "value": winner.value,
        "setup": setup_of(winner.record),
        "weights_sha256": winner.record.get("weights_sha256"),
        "published": published,
        "base_path": os.path.abspath(base_path),  # the record's own, whatever folder a later selection runs from
        "version": int(os.path.basename(published)),
    }


# What a served record holds, each field's type: anything else is a record edited or damaged by hand.
SERVED_FIELDS = {
    "model_dir": str,
    "metric": str,
    "higher_is_better": bool,
    "value": float,
    "setup": dict,
    "published": str,
    "base_path": str,
    "version": int,
}


def recorded_served(previous: dict[str, Any] | None, base_path: str) -> dict[str, Any] | None:
    """The record of the model the base path serves (its newest version), or None where no selection published it:
    no selection.json, one from before records were kept, or a newer version copied in by hand. Raises
    SelectionError for a record that is damaged or another base path's (two in one folder share selection.json)."""
    served = previous.get("served") if previous else None
    if served is None:
        return None
    path = selection_path(base_path)
    wrong = [
        name
        for name, kind in SERVED_FIELDS.items()
        if not isinstance(served, dict)
        or not isinstance(served.get(name), kind if kind is not float else (int, float))
        or isinstance(served.get(name), bool) is not (kind is bool)
    ]
    if wrong or not math.isfinite(served["value"]):
        raise SelectionError(f"{path}: its served record is damaged ({', '.join(wrong) or 'value'}): {RECORD_FIX}")
    if served["base_path"] != os.path.abspath(base_path):
        raise SelectionError(
            f"{path} records the model served from {served['base_path']}, not {os.path.abspath(base_path)}: two base "
            f"paths in one folder would share one record; give this one a folder of its own (.../NAME/serving)"
        )
    if served["version"] != max(numbered_versions(base_path), default=None):
        return None
    return served


def reason_to_keep(winner: Candidate, objective: Objective, served: dict[str, Any]) -> str | None:
    """Why the served model stays rather than the winner (not better, or not comparable), or None to publish."""
    shown = f"{served['published']} ({served['metric']} {served['value']}, from {served['model_dir']})"
    if (served["metric"], served["higher_is_better"]) != (objective.key, objective.higher_is_better):
        return f"the served {shown} was judged by another objective, so the winner's {objective.key} does not compare"
    differences = setup_differences(winner.record, served["setup"], "the served model's")
    if differences:
        return f"the served {shown} was tested on other data, so the figures do not compare: {differences}"
    sign = 1.0 if objective.higher_is_better else -1.0
    if sign * (winner.value or 0.0) > sign * served["value"]:
        return None
    return f"the served {shown} scores at least as well as the winner ({objective.key} {winner.value})"


def select(model_dirs: list[str], base_path: str, replace: bool = False) -> dict[str, Any]:
    """Judges the candidates, publishes the winner unless the base path already serves it, or serves a model that is
    as good or not comparable (unless replace), and writes selection.json; under the base path's selection lock."""
    if URL_SCHEME.match(base_path):
        raise SelectionError(f"--base-path {base_path}: a URL; give a path on a filesystem (a mounted volume)")
    with selection_lock(base_path):
        try:
            previous = previous_selection(base_path)
        except SelectionError:
            if not replace:
                raise
            previous = None  # replaced whole: the winner is published and recorded anew
        served = None if replace else recorded_served(previous, base_path)
        candidates, winner, objective = choose(model_dirs, served["setup"] if served else None)
        summary = [candidate.summary() for candidate in candidates]
        if winner is None:
            reasons = "; ".join(f"{c.model_dir}: {c.refused}" for c in candidates)
            raise SelectionError(f"no candidate can be served ({reasons})")
        assert objective is not None
        digest = winner.record.get("weights_sha256")
        kept = None
        unchanged = served is not None and (served["model_dir"], served["weights_sha256"]) == (winner.model_dir, digest)
        if served is not None and not unchanged:
            kept = reason_to_keep(winner, objective, served)
            if kept is not None:
                kept += ": it stays published (--replace, REPLACE=1 for make, publishes the winner all the same)"
        if served is None or (not unchanged and kept is None):
            served = served_record(winner, objective, base_path, publish(winner, base_path))
        decision = {
            "candidates": summary,
            "winner": winner.model_dir,
            "published": served["published"],
            "kept": kept,
            "objective": {"metric": objective.key, "higher_is_better": objective.higher_is_better},
            "winner_weights_sha256": digest,
            "served": served,
        }
        if decision != previous:
            write_json(selection_path(base_path), decision, sort_keys=False)
    return decision


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.serving.select", description="the best trained model, published"
    )
    parser.add_argument("--candidates", nargs="+", required=True, help="the trained model dirs to choose from")
    parser.add_argument("--base-path", required=True, help="the served base path to publish the winner into")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="publish the winner even where the served model scores as well or was tested on other data",
    )
    parser.add_argument("--json", action="store_true", help="print the decision (selection.json's record) as JSON")
    args = parser.parse_args(argv)
    try:
        decision = select(args.candidates, args.base_path, args.replace)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if args.json:
        print(json.dumps(decision))
        return ExitCode.OK
    for candidate in decision["candidates"]:
        verdict = (
            f"refused: {candidate['refused']}"
            if candidate["refused"]
            else f"{candidate['metric']} {candidate['value']}"
        )
        print(f"{candidate['model_dir']}: {verdict}")
    if decision["kept"]:
        print(f"winner {decision['winner']}, not published: {decision['kept']} ({selection_path(args.base_path)})")
    else:
        print(f"winner {decision['winner']}, served from {decision['published']} ({selection_path(args.base_path)})")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())

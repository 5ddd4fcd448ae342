"""`python -m trainer.serving.select` (make select): the best candidate by the task's own objective is published
under a version higher than any in the base path, each bad candidate is refused with its reason, selection.json
records the decision, a second run with nothing new changes nothing, and ties go to the first listed. At the end,
examples/regression.py trained twice for real, selected and served."""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest

from model_server import ROOT, ServerProcess
from trainer.serving import select as selection_module

CONFIG = {
    "task": "image_classification",
    "task_module": "",
    "dataset": "synthetic",
    "dataset_module": "",
    "test_files": "",
    "test_examples": 64,
    "seed": 42,
}


def candidate(root: pathlib.Path, name: str, accuracy: float | None = 0.5, **changes) -> pathlib.Path:
    """A finished run's model dir as the trainer leaves it (a stand-in SavedModel: selection only copies it)."""
    model_dir = root / name / "model"
    version = model_dir / "serving" / "16"
    (version / "variables").mkdir(parents=True)
    (version / "saved_model.pb").write_text(name)
    record = {
        "config": {**CONFIG, **changes.pop("config", {})},
        "test_examples": 64,
        "test_loss": 1.0,
        "weights_sha256": f"sha-of-{name}",
        "steps": 16,
        "export_check": {"passed": True, "examples": 64, "max_abs_diff": 0.0, "tolerance": 1e-5, "signature": "serve"},
    }
    if accuracy is not None:
        record["test_accuracy"] = accuracy
    record.update(changes)
    (model_dir / "metrics.json").write_text(json.dumps(record))
    (model_dir / "status.json").write_text(json.dumps({"state": "succeeded"}))
    return model_dir


def select(
    base_path: pathlib.Path | str,
    *model_dirs: pathlib.Path,
    flags: tuple[str, ...] = (),
    cwd: pathlib.Path | str = ROOT,
) -> subprocess.CompletedProcess:
    """The selection as a command, from the checkout unless `cwd` says otherwise."""
    return subprocess.run(
        [sys.executable, "-m", "trainer.serving.select", *flags, "--base-path", str(base_path), "--candidates"]
        + [str(path) for path in model_dirs],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def selection(base_path: pathlib.Path) -> dict:
    return json.loads((base_path.parent / "selection.json").read_text())


def test_the_highest_test_accuracy_wins_and_is_published_above_every_version_there(tmp_path):
    dirs = [candidate(tmp_path, name, accuracy) for name, accuracy in (("cnn", 0.8), ("dropout", 0.9), ("bn", 0.7))]
    base_path = tmp_path / "selected" / "serving"
    (base_path / "41").mkdir(parents=True)  # an earlier version, published by hand
    done = select(base_path, *dirs)
    assert done.returncode == 0, done.stderr
    record = selection(base_path)
    assert record["winner"] == str(dirs[1])
    assert record["published"] == str(base_path / "42")
    assert (base_path / "42" / "saved_model.pb").read_text() == "dropout"
    assert [c["value"] for c in record["candidates"]] == [0.8, 0.9, 0.7]
    assert {c["metric"] for c in record["candidates"]} == {"test_accuracy"}
    assert all(c["refused"] is None for c in record["candidates"])
    assert sorted(path.name for path in base_path.iterdir()) == ["41", "42"]  # no partial copy left behind


def test_with_json_the_command_prints_the_decision_it_recorded(tmp_path):
    dirs = [candidate(tmp_path, name, accuracy) for name, accuracy in (("a", 0.7), ("b", 0.9))]
    base_path = tmp_path / "selected" / "serving"
    done = select(base_path, *dirs, flags=("--json",))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == selection(base_path)
    assert selection(base_path)["winner"] == str(dirs[1])


def test_running_again_with_nothing_new_changes_nothing_and_a_better_result_is_published_next(tmp_path):
    first, second = candidate(tmp_path, "a", 0.8), candidate(tmp_path, "b", 0.6)
    base_path = tmp_path / "selected" / "serving"
    assert select(base_path, first, second).returncode == 0
    written = (base_path.parent / "selection.json").stat().st_mtime_ns
    again = select(base_path, first, second)
    assert again.returncode == 0, again.stderr
    assert sorted(path.name for path in base_path.iterdir()) == ["1"]
    assert (base_path.parent / "selection.json").stat().st_mtime_ns == written

    better = candidate(tmp_path, "c", 0.95)
    assert select(base_path, first, second, better).returncode == 0
    assert selection(base_path)["published"] == str(base_path / "2")
    assert (base_path / "2" / "saved_model.pb").read_text() == "c"


def test_a_tie_goes_to_the_candidate_listed_first(tmp_path):
    dirs = [candidate(tmp_path, name, 0.75) for name in ("z", "a", "m")]
    base_path = tmp_path / "selected" / "serving"
    assert select(base_path, *dirs).returncode == 0
    assert selection(base_path)["winner"] == str(dirs[0])


def test_two_selections_at_once_publish_two_versions_and_the_record_names_the_last(tmp_path, monkeypatch):
    # Before: both took max + 1 while copying, both returned serving/1, and the second copy replaced the first.
    first, second = candidate(tmp_path, "first", 0.8), candidate(tmp_path, "second", 0.9)
    base_path = tmp_path / "selected" / "serving"
    both_copying, copy = threading.Barrier(2, timeout=3), shutil.copytree

    def copy_when_both_copy(*args, **kwargs):
        try:
            both_copying.wait()  # the two copies overlap, unless one selection waits for the other
        except threading.BrokenBarrierError:
            pass
        return copy(*args, **kwargs)

    monkeypatch.setattr(shutil, "copytree", copy_when_both_copy)
    decisions = {}

    def run_selection(model_dir: pathlib.Path) -> None:
        # replace: each publishes whatever the other did first (without it, the worse one second is kept instead)
        decisions[model_dir.parent.name] = selection_module.select([str(model_dir)], str(base_path), replace=True)

    threads = [threading.Thread(target=run_selection, args=(model_dir,)) for model_dir in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    published = {name: decision["published"] for name, decision in decisions.items()}
    assert sorted(published.values()) == [str(base_path / "1"), str(base_path / "2")], published
    for name, folder in published.items():
        assert (pathlib.Path(folder) / "saved_model.pb").read_text() == name
    last = max(published, key=lambda name: published[name])
    assert selection(base_path)["winner"] == str(tmp_path / last / "model")
    assert sorted(path.name for path in base_path.iterdir()) == ["1", "2"]  # no copy left behind


def published_names(base_path: pathlib.Path) -> dict[str, str]:
    """Each version in the base path: the candidate its stand-in SavedModel came from."""
    return {path.name: (path / "saved_model.pb").read_text() for path in sorted(base_path.iterdir())}


def test_published_models_only_get_better_whatever_publishes_next(tmp_path):
    # The new user's order: run-local's 0.833 selected, then tune's 0.65 winner, then the pipeline's 0.717 and an
    # equal 0.833. Before: each was published over the better one, and make serve served the last.
    base_path = tmp_path / "selected" / "serving"
    for name, accuracy in (("run-local", 0.833), ("tune", 0.65), ("pipeline", 0.717), ("rerun", 0.833)):
        done = select(base_path, candidate(tmp_path, name, accuracy))
        assert done.returncode == 0, done.stderr
    assert published_names(base_path) == {"1": "run-local"}
    record = selection(base_path)
    assert record["winner"] == str(tmp_path / "rerun" / "model") and record["published"] == str(base_path / "1")
    assert "scores at least as well as the winner (test_accuracy 0.833)" in record["kept"], record["kept"]
    assert "not published: the served" in done.stdout and "REPLACE=1" in done.stdout, done.stdout
    assert record["served"]["model_dir"] == str(tmp_path / "run-local" / "model")

    better = select(base_path, candidate(tmp_path, "better", 0.9))
    assert better.returncode == 0, better.stderr
    assert published_names(base_path) == {"1": "run-local", "2": "better"}
    assert selection(base_path)["kept"] is None


def test_replace_publishes_a_worse_winner_all_the_same(tmp_path):
    base_path = tmp_path / "selected" / "serving"
    assert select(base_path, candidate(tmp_path, "good", 0.9)).returncode == 0
    done = select(base_path, candidate(tmp_path, "worse", 0.5), flags=("--replace",))
    assert done.returncode == 0, done.stderr
    assert published_names(base_path) == {"1": "good", "2": "worse"}
    assert selection(base_path)["served"]["value"] == 0.5
    # ...and the next selection is held against what is served now
    assert select(base_path, candidate(tmp_path, "middle", 0.7)).returncode == 0
    assert published_names(base_path)["3"] == "middle"


def test_a_lower_loss_wins_over_the_served_model_where_lower_is_better(tmp_path):
    base_path = tmp_path / "selected" / "serving"
    regression = {"task": "regression", "module": "examples.regression"}
    # In process: the regression module (and TensorFlow with it) is imported once, not by three commands.
    for name, loss in (("first", 0.4), ("worse", 0.5), ("lower", 0.3)):
        model_dir = candidate(tmp_path, name, None, test_loss=loss, config=regression)
        selection_module.select([str(model_dir)], str(base_path))
    assert published_names(base_path) == {"1": "first", "2": "lower"}


def test_a_winner_tested_on_other_data_does_not_replace_the_served_model(tmp_path):
    base_path = tmp_path / "selected" / "serving"
    assert select(base_path, candidate(tmp_path, "served", 0.6)).returncode == 0
    done = select(base_path, candidate(tmp_path, "elsewhere", 0.99, config={"test_examples": 128}))
    assert done.returncode == 0, done.stderr
    assert published_names(base_path) == {"1": "served"}
    kept = selection(base_path)["kept"]
    assert "was tested on other data" in kept and "test_examples 128 (the served model's: 64)" in kept, kept


def test_a_served_version_removed_or_superseded_by_hand_has_no_record_to_hold_against(tmp_path):
    base_path = tmp_path / "selected" / "serving"
    assert select(base_path, candidate(tmp_path, "good", 0.9)).returncode == 0
    shutil.copytree(base_path / "1", base_path / "5")  # a version copied in by hand is what the server serves now
    assert select(base_path, candidate(tmp_path, "worse", 0.5)).returncode == 0
    assert published_names(base_path) == {"1": "good", "5": "good", "6": "worse"}


def test_two_base_paths_in_one_folder_are_refused_rather_than_publishing_backwards(tmp_path):
    # Before: b's selection overwrote a's record, and a then published 0.3 over its 0.9.
    folder = tmp_path / "two"
    assert select(folder / "a", candidate(tmp_path, "good", 0.9)).returncode == 0
    done = select(folder / "b", candidate(tmp_path, "other", 0.3))
    assert done.returncode == 2, done.stderr
    assert f"records the model served from {folder / 'a'}" in done.stderr and "a folder of its own" in done.stderr
    assert not (folder / "b").exists()
    assert select(folder / "a", candidate(tmp_path, "worse", 0.3)).returncode == 0
    assert published_names(folder / "a") == {"1": "good"}


def test_the_record_holds_wherever_the_next_selection_runs_from(tmp_path):
    # Before: a base path given relative to one folder was not recognised from another, and 0.3 replaced 0.9.
    base_path = tmp_path / "pub" / "serving"
    first = select("pub/serving", candidate(tmp_path, "good", 0.9), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert select(base_path, candidate(tmp_path, "worse", 0.3)).returncode == 0  # from ROOT, by its absolute path
    assert published_names(base_path) == {"1": "good"}


DAMAGED = {
    "not json": lambda record: "{truncated",
    "not an object": lambda record: "[]",
    "value null": lambda record: json.dumps({**record, "served": {**record["served"], "value": None}}),
    "value a string": lambda record: json.dumps({**record, "served": {**record["served"], "value": "0.9x"}}),
    "no metric": lambda record: json.dumps(
        {**record, "served": {k: v for k, v in record["served"].items() if k != "metric"}}
    ),
    "setup null": lambda record: json.dumps({**record, "served": {**record["served"], "setup": None}}),
    "published a number": lambda record: json.dumps({**record, "served": {**record["served"], "published": 5}}),
    "served a list": lambda record: json.dumps({**record, "served": []}),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_record_stops_the_selection_and_replace_goes_past_it(tmp_path, case):
    # Before: a traceback (exit 1) for some, and a worse winner published for the others.
    base_path = tmp_path / "selected" / "serving"
    assert select(base_path, candidate(tmp_path, "good", 0.9)).returncode == 0
    record_file = base_path.parent / "selection.json"
    record_file.write_text(DAMAGED[case](json.loads(record_file.read_text())))
    worse = candidate(tmp_path, "worse", 0.3)
    done = select(base_path, worse)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert str(record_file) in done.stderr and "--replace" in done.stderr, done.stderr
    assert published_names(base_path) == {"1": "good"}
    replaced = select(base_path, worse, flags=("--replace",))
    assert replaced.returncode == 0, replaced.stderr
    assert published_names(base_path) == {"1": "good", "2": "worse"}
    assert selection(base_path)["served"]["model_dir"] == str(worse)


def test_a_url_base_path_is_refused_before_anything_is_written(tmp_path):
    # Before: it published into a local folder named "gs:" and said it had served gs://.
    done = select("gs://bucket/serving", candidate(tmp_path, "good", 0.9), cwd=tmp_path)
    assert done.returncode == 2 and "--base-path gs://bucket/serving: a URL" in done.stderr, done.stderr
    assert not (tmp_path / "gs:").exists()


def test_candidates_are_ranked_on_the_served_models_data_whatever_is_listed_first(tmp_path):
    # Before: a run on other data listed first set the setup, so the comparable run was refused and nothing published.
    base_path = tmp_path / "selected" / "serving"
    assert select(base_path, candidate(tmp_path, "served", 0.5)).returncode == 0
    elsewhere = candidate(tmp_path, "elsewhere", 0.99, config={"test_examples": 128})
    comparable = candidate(tmp_path, "comparable", 0.7)
    done = select(base_path, elsewhere, comparable)
    assert done.returncode == 0, done.stderr
    record = selection(base_path)
    assert record["winner"] == str(comparable) and record["kept"] is None
    assert "test_examples 128 (the served model's: 64)" in record["candidates"][0]["refused"]
    assert published_names(base_path) == {"1": "served", "2": "comparable"}


def image_folder_candidate(root: pathlib.Path, name: str, accuracy: float, image_dir: pathlib.Path, **config):
    config = {"dataset": "image_folder", "image_dir": str(image_dir), "validation_split": 0.2, **config}
    return candidate(root, name, accuracy, config=config, class_names=["cat", "dog"])


def test_image_folder_runs_tested_on_other_images_are_not_ranked_together(tmp_path):
    # Before: two folders' runs were ranked together, and the one with the easier test set won.
    folders = {name: tmp_path / name for name in ("photos", "other", "held-out")}
    for folder in ("photos", "other"):
        (folders[folder] / "test").mkdir(parents=True)
    folders["held-out"].mkdir()  # no test/: the test split is a seeded share of train/
    photos = image_folder_candidate(tmp_path, "photos-run", 0.7, folders["photos"])
    cases = {
        "another folder": (image_folder_candidate(tmp_path, "other-run", 0.9, folders["other"]), "image_dir"),
        "other classes": (
            candidate(
                tmp_path, "classes", 0.9, config={"dataset": "image_folder", "image_dir": str(folders["photos"])}
            ),
            "class_names",
        ),
    }
    for case, (other, key) in cases.items():
        base_path = tmp_path / case / "serving"
        done = select(base_path, photos, other)
        assert done.returncode == 0, done.stderr
        assert selection(base_path)["winner"] == str(photos), case
        refused = selection(base_path)["candidates"][1]["refused"]
        assert refused.startswith("its setup differs") and key in refused, refused
    # With a test/ folder the seed does not choose the test split, so runs with other seeds compare.
    reseeded = image_folder_candidate(tmp_path, "reseeded", 0.8, folders["photos"], seed=7)
    assert select(tmp_path / "seeds" / "serving", photos, reseeded).returncode == 0
    assert selection(tmp_path / "seeds" / "serving")["winner"] == str(reseeded)
    # Without one, it does, and so does the share held out.
    held = image_folder_candidate(tmp_path, "held", 0.6, folders["held-out"])
    for name, changes in (("seed", {"seed": 7}), ("validation_split", {"validation_split": 0.3})):
        other = image_folder_candidate(tmp_path, f"held-{name}", 0.9, folders["held-out"], **changes)
        base_path = tmp_path / f"held-{name}" / "serving"
        assert select(base_path, held, other).returncode == 0
        refused = selection(base_path)["candidates"][1]["refused"]
        assert refused and name in refused, refused


BAD = {
    "unfinished": ("the run did not finish", {}),
    "nan": ("not finite", {"test_accuracy": math.nan}),
    "missing metric": ("test_accuracy is missing", {"accuracy": None}),
    "another task": ("task 'regression'", {"config": {"task": "regression"}}),
    "another test split": ("test_examples 128", {"config": {"test_examples": 128}}),
    "another synthetic seed": ("seed 7", {"config": {"seed": 7}}),
    "no export check": ("export was not checked", {"export_check": None}),
    "failed export check": ("failed the check", {"export_check": {"passed": False, "max_abs_diff": 0.3}}),
    "training again": ("status.json says 'running'", {}),
    "a later export than the evaluated step": ("not the one evaluated at step 8", {"steps": 8}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_candidate_is_refused_with_its_reason(tmp_path, case):
    reason, changes = BAD[case]
    good = candidate(tmp_path, "good", 0.5)
    accuracy = changes.pop("accuracy", 0.99)
    bad = candidate(tmp_path, "bad", accuracy, **changes)
    if case == "unfinished":
        (bad / "metrics.json").unlink()
    if case == "training again":
        (bad / "status.json").write_text(json.dumps({"state": "running"}))
    base_path = tmp_path / "selected" / "serving"
    done = select(base_path, good, bad)
    assert done.returncode == 0, done.stderr
    record = selection(base_path)
    assert record["winner"] == str(good)
    refused = record["candidates"][1]["refused"]
    assert refused and reason in refused, refused


@pytest.mark.parametrize("old_first", [True, False])
def test_a_refused_candidate_sets_no_setup_for_the_others_whatever_its_place(tmp_path, old_first):
    # Before: the old run listed first was refused, yet its test split was the one the valid run was held to.
    old = candidate(tmp_path, "old", 0.99, export_check=None, config={"test_examples": 128})
    new = candidate(tmp_path, "new", 0.5)
    base_path = tmp_path / "selected" / "serving"
    done = select(base_path, *((old, new) if old_first else (new, old)))
    assert done.returncode == 0, done.stderr
    record = selection(base_path)
    assert record["winner"] == str(new)
    (refused,) = [c["refused"] for c in record["candidates"] if c["model_dir"] == str(old)]
    assert "export was not checked" in refused if old_first else "test_examples 128" in refused, refused


def test_with_no_acceptable_candidate_nothing_is_published_and_every_reason_is_named(tmp_path):
    bad = candidate(tmp_path, "nan", math.nan)
    unfinished = tmp_path / "empty" / "model"
    unfinished.mkdir(parents=True)
    base_path = tmp_path / "selected" / "serving"
    done = select(base_path, unfinished, bad)
    assert done.returncode == 2
    assert "no candidate can be served" in done.stderr
    assert "did not finish" in done.stderr and "not finite" in done.stderr
    assert not base_path.exists()


@pytest.mark.slow  # several processes for long: make test-slow
def test_regression_trained_selected_by_lowest_test_loss_and_served(regression_models, tmp_path):
    base_path = tmp_path / "selected" / "serving"
    done = select(base_path, *regression_models)
    assert done.returncode == 0, done.stderr
    record = selection(base_path)
    losses = {c["model_dir"]: c["value"] for c in record["candidates"]}
    assert {c["metric"] for c in record["candidates"]} == {"test_loss"}
    assert record["winner"] == min(losses, key=losses.get)

    import tensorflow as tf

    winner = pathlib.Path(record["winner"])
    (exported,) = [path for path in (winner / "serving").iterdir() if path.name.isdigit()]
    features = np.random.default_rng(0).uniform(-1, 1, (4, 8)).astype(np.float32)
    expected = tf.saved_model.load(str(exported)).signatures["serve"](features=tf.constant(features))["prediction"]
    server = ServerProcess(base_path, "regression", tmp_path / "server.log").wait_ready()
    try:
        answered = httpx.post(f"{server.url}/v1/models/regression:predict", json={"instances": features.tolist()})
        assert answered.status_code == 200, answered.text
        np.testing.assert_allclose(answered.json()["predictions"], expected.numpy(), rtol=1e-6)
        assert httpx.get(f"{server.url}/v2/models/regression").json()["versions"] == ["1"]
    finally:
        server.stop()

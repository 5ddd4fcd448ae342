"""`python -m trainer.data`: makes sure the data is there and reads before any worker starts (the cluster's
data-preparation Job and run-local run it). A TFDS dataset is downloaded and prepared once under --data-dir, so
workers never download concurrently; your own TFRecord files are counted (once: the counts go into the record index
beside them, trainer/data/record_counts.py) and their class ids checked; an image folder's files are listed and
each checked once (trainer/data/image_check.py: by content, so a rerun decodes only what changed), and the shape
they are read as said with its reason; a dataset your module registers is built and its splits sized. Each reports
one line, and what cannot work exits 2 naming the file, the record or your function, so a job never starts on data
that fails. It reads the trainer's flags and TRAINER_* variables: the core ones and every dataset kind's; the task's
own flags are left to `python -m trainer`, which checks them.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from trainer import context
from trainer.base.errors import (
    BrokenEnvironmentError,
    CorruptRecordError,
    DataError,
    ExitCode,
    UserError,
    first_line,
    missing_module,
)
from trainer.data import catalog, datasets, image_check, image_folder, tfrecord
from trainer.data.datasets import LABEL_FIX
from trainer.data.tfds import TfdsOptions
from trainer.settings import flags
from trainer.settings.config import Config


def prepare(dataset: str, data_dir: str) -> str:
    """Downloads and prepares a TFDS dataset once; a no-op when it is already there."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(dataset, data_dir=os.path.expanduser(data_dir))
    builder.download_and_prepare()
    return builder.data_dir


def check_files(config: Config) -> str:
    """One line: files and examples of each split, or a DataError naming what is missing. The counts come from
    the record index beside the files, and files it does not know are counted and added to it (or to the one in
    --model-dir where their folder is read-only), so no trainer start counts them."""
    from trainer.data.corrupt_records import SkippedRecords
    from trainer.data.record_counts import RecordCounts

    counts = RecordCounts(config.model_dir)
    options = config.group(tfrecord.RecordOptions)
    # A corrupt file fails the check as it would fail the trainer; under skip it is logged and counted as readable.
    skipped = SkippedRecords() if options.on_corrupt_record == "skip" else None
    shape = tfrecord.parse_image_shape(options.image_shape)
    parts, classes, dropped = [], {}, 0
    for split, pattern, flag in (
        ("train", options.train_files, "--train-files"),
        ("test", options.test_files, "--test-files"),
    ):
        files = tfrecord.glob_files(pattern, flag)
        records = counts.counts(files, skipped)
        parts.append(f"{split} {len(files)} files {sum(records)} examples")
        # Every record decoded once, as the trainer will: an image that is no image, an id out of range, named now.
        read = tfrecord.RecordFiles(files, shape, options.image_feature, options.label_feature, counts)
        classes[split], undecoded = tfrecord.checked_records(read, records, options.num_classes, skipped is not None)
        dropped += undecoded
    coverage = _class_coverage(classes["train"], classes["test"], options.test_files)
    skipping = f", {dropped} records that do not decode skipped" if dropped else ""
    return f"dataset tfrecord is ready: {', '.join(parts)}{skipping}{coverage}"


def _class_coverage(train: list[int], test: list[int], test_files: str) -> str:
    """Refuses test class ids the training split never has (ids shifted between splits train a model that cannot
    score); a class the test split lacks is said in the ready line."""
    unseen = [class_id for class_id, count in enumerate(test) if count and not train[class_id]]
    if unseen:
        raise DataError(
            f"the test split (--test-files {test_files}) has class id(s) {unseen[:10]} that no training record "
            f"has: the ids mean different "
            f"classes in the two splits, or a class is missing from training; {LABEL_FIX}"
        )
    untested = [class_id for class_id, count in enumerate(test) if not count]
    return f" (no test record of class id(s) {untested[:10]})" if untested else ""


def check_images(config: Config) -> str:
    """One line: the image folder's classes and images and the shape they are read as, and why; every file checked
    once (image_check.py: a DataError naming the first refused, unless --on-corrupt-record skip, which lists them
    and goes on), the verdicts of files unchanged since the last check taken from its record."""
    listing = image_folder.check_flags(config)
    shape, why = image_folder.chosen_shape(config, listing)
    image_dir = config.group(image_folder.FolderOptions).image_dir
    paths = [path for path, _ in listing.train + listing.test]
    checked_record = image_check.Record(image_dir)
    checked = image_check.refused(paths, shape, checked_record)
    failed = checked.refused
    skip = config.group(tfrecord.RecordOptions).on_corrupt_record == "skip"
    if failed and not skip:
        more = f" ({len(failed) - 1} more file(s) are refused too)" if len(failed) > 1 else ""
        raise CorruptRecordError(f"the data check: {failed[0].path}: {failed[0].problem}{more}; {failed[0].fix}")
    for path, problem, _ in failed:
        print(f"warning: skipping {path}: {problem} (--on-corrupt-record skip)", flush=True)
    names = listing.class_names
    listed = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    tested = {label for _, label in listing.test}
    untested = [name for class_id, name in enumerate(names) if class_id not in tested]
    unchanged = f"{checked.remembered} unchanged since the last check, not decoded again" if checked.remembered else ""
    remembered = "" if checked.kept else f"not remembered: cannot write {checked_record.path}"
    notes = "; ".join(note for note in (unchanged, remembered) if note)
    return (
        f"dataset image_folder is ready at {image_dir}: {len(names)} classes ({listed}), "
        f"train {len(listing.train)} images, test {len(listing.test)} images (from {listing.test_from})"
        + (f" ({notes})" if notes else "")
        + f", read as {'x'.join(map(str, shape))}"
        + (" (--image-shape)" if why == "--image-shape" else f": {why}")
        + (f", {len(failed)} that do not decode skipped" if failed else "")
        + (f" (no test image of {', '.join(untested[:10])})" if untested else "")
    )


def check_registered(config: Config) -> str:
    """One line: a registered dataset built (your function, whose error is named) and its splits sized."""
    source = catalog.load(config)
    sizes = [datasets.checked_shard(source, split, 0, 1).size for split in (source.train, source.test)]
    for name, split in (("train", source.train), ("test", source.test)):
        if isinstance(split, datasets.Arrays) and source.num_classes:  # rows in memory: their ids checked at once
            _check_class_ids(name, split.targets, source.num_classes)
    classes = f", {source.num_classes} classes" if source.num_classes else ""
    return f"dataset {config.dataset} is ready: train {sizes[0]} examples, test {sizes[1]} examples{classes}"


def read_config(argv: list[str]) -> Config:
    """The core and dataset settings of the trainer's command line, after importing the modules that may register
    datasets (--module, and the older flags that name one); --dataset, where not given, is the one --module
    registers."""
    core = flags.parse(argv, None, catalog.option_groups(), partial=True, add_help=False)
    catalog.import_dataset_module(core.module, "--module")
    catalog.import_dataset_module(core.dataset_module)
    catalog.import_dataset_module(core.task_module, "--task-module")
    config = flags.parse(argv, None, catalog.option_groups(), partial=True)
    context.check_variables(os.environ, chosen=None)
    dataset = catalog.chosen_dataset(config.dataset, config.module, catalog.dataset_given(argv, os.environ))
    return dataclasses.replace(config, dataset=dataset)


def main(argv: list[str] | None = None) -> int:
    try:
        return prepare_or_check(sys.argv[1:] if argv is None else argv)
    except Exception as error:
        user_error = error if isinstance(error, UserError) else missing_module(error)
        if user_error is None:
            raise
        print(f"error: {user_error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG


def _check_class_ids(split: str, targets: object, num_classes: int) -> None:
    import numpy as np

    ids = np.asarray(targets)
    if ids.dtype.kind not in "iu":
        return
    outside = np.flatnonzero((ids < 0) | (ids >= num_classes))
    if outside.size:
        row = int(outside[0])
        raise DataError(
            f"the data check: row {row} of the {split} split has class id {int(ids.reshape(-1)[row])}, not in "
            f"[0, {num_classes}) ({outside.size} such row(s)); {LABEL_FIX}"
        )


def prepare_or_check(argv: list[str]) -> int:
    config = read_config(argv)
    catalog.check_dataset(config)
    if config.dataset == "tfrecord":
        print(check_files(config), flush=True)
        return 0
    if config.dataset == "image_folder":
        print(check_images(config), flush=True)
        return 0
    if config.dataset == "synthetic":
        print(f"dataset {config.dataset}: nothing to prepare (generated in the graph)", flush=True)
        return 0
    if config.dataset in datasets.DATASETS:
        print(check_registered(config), flush=True)
        return 0
    data_dir = config.group(TfdsOptions).data_dir
    try:
        path = prepare(config.dataset, data_dir)
    except Exception as error:  # TFDS raises many kinds for one failed download; each is reported the same way
        broken = missing_module(error)
        if broken is not None:  # a broken image, not a download problem
            raise BrokenEnvironmentError(f"preparing {config.dataset} failed: {broken}") from error
        print(
            f"error: preparing {config.dataset} in {data_dir} failed ({type(error).__name__}: "
            f"{first_line(error)[:300]}). Check the network or proxy and that the directory is writable, then run "
            f"again; --dataset synthetic needs no download.",
            file=sys.stderr,
        )
        return 1
    print(f"dataset {config.dataset} is ready at {path}", flush=True)
    return 0


if __name__ == "__main__":
    from trainer.reporting import tf_log_filter

    # TensorFlow's start-up lines that are no failure, dropped as the trainer drops them.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    tf_log_filter.install()
    sys.exit(main())

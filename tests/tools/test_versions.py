"""make versions: every pin with its release date and support end, read where it is pinned; a warning, never a
failure, for a pin past its support end or bumped without its dates read again; docs/versions.md is its table."""

from __future__ import annotations

import datetime
import os
import pathlib
import re
import subprocess
import sys

import yaml

from python_module import run_module
from scripts.common.settings import load_file
from scripts.versions.versions import RELEASES, constraint, last_day, markdown, read_releases, release_files, rows

ROOT = pathlib.Path(__file__).resolve().parents[2]


def every_release():
    """The records make versions reads: this room's and each other room's (the local node's)."""
    return [release for path in release_files() for release in read_releases(path)]


def versions(*flags: str, **environment: str) -> subprocess.CompletedProcess:
    return run_module("scripts.versions.versions", *flags, env={**os.environ, **environment}, timeout=60)


def test_every_pin_is_listed_at_the_version_its_file_pins():
    done = versions("--on", "2026-10-26")
    assert done.returncode == 0, done.stderr
    settings = load_file()
    listed = {line.split("  ")[0]: line for line in done.stdout.splitlines()[1:]}
    for release in every_release():
        assert release.component in listed
    k3s = settings["K3S_IMAGE"].split(":")[1].split("-k3s")[0]
    assert re.search(rf"^k3s \(k3d's node\)\s+{k3s}\s", done.stdout, re.M)
    pinned_tf = re.search(r"^tensorflow==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    assert re.search(rf"^TensorFlow\s+{re.escape(pinned_tf)}\s", done.stdout, re.M)
    # Every version setting is a pin with a record, so a new pin cannot leave the page.
    pins = {release.pin for release in every_release()}
    version_keys = {key for key in settings if key.endswith("_VERSION") and not key.endswith("_TESTED_AT_VERSION")}
    assert {key for key in version_keys if f"settings:{key}" not in pins} == set()


def test_a_checkout_reached_through_a_symlink_lists_each_pin_once(tmp_path):
    (tmp_path / "checkout").symlink_to(ROOT)
    done = subprocess.run(  # the tools imported through the link, from outside the checkout
        [sys.executable, "-m", "scripts.versions.versions", "--on", "2026-10-26"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "checkout")},
    )
    assert done.returncode == 0, done.stderr
    components = [line.split("  ")[0] for line in done.stdout.splitlines()[1:]]
    assert len(components) == len(set(components)) == len(every_release()), done.stdout


def day_after(month_or_day: str) -> str:
    return (last_day(month_or_day) + datetime.timedelta(days=1)).isoformat()


def test_a_pin_past_its_support_end_warns_and_exits_zero():
    (k3s,) = [r for r in every_release() if r.pin == "settings:K3S_IMAGE"]
    last = last_day(k3s.support_ends).isoformat()
    before, after = versions("--on", last), versions("--on", day_after(k3s.support_ends))
    assert before.returncode == after.returncode == 0
    ended = f"k3s (k3d's node) {k3s.read_for}: its support ended on {k3s.support_ends}"
    assert ended not in before.stderr
    assert f"warning: {ended}" in after.stderr
    # "ended" without a date is past on any day.
    assert "warning: Kubeflow training operator (TFJob) v1.9.4: its support ended:" in before.stderr


def test_a_pin_bumped_without_its_dates_read_again_warns_naming_both_versions():
    (k3s,) = [r for r in every_release() if r.pin == "settings:K3S_IMAGE"]
    done = versions("--on", "2026-01-01", K3S_IMAGE="rancher/k3s:v1.99.0-k3s1")
    assert done.returncode == 0
    assert re.search(r"^k3s \(k3d's node\)\s+v1\.99\.0\s", done.stdout, re.M)
    assert f"warning: k3s (k3d's node) is pinned at v1.99.0, but its dates were read for {k3s.read_for}" in done.stderr


def test_the_committed_records_match_the_pins():
    """The release dates on the page are the pinned versions' own: bump a pin, read its dates again."""
    stale = [(row.release.component, row.version, row.release.read_for) for row in rows(every_release(), load_file())]
    assert [entry for entry in stale if entry[1] != entry[2]] == []


def test_docs_versions_is_the_table_the_command_prints():
    page = (ROOT / "docs" / "versions.md").read_text()
    table = markdown(rows(every_release(), load_file()))
    assert page.endswith(table), "docs/versions.md's table differs: python -m scripts.versions.versions --markdown"


def test_a_broken_record_exits_2_naming_it(tmp_path):
    records = yaml.safe_load(RELEASES.read_text())
    cases = {
        "support_ends": ({"support_ends": "soon"}, "Kueue: support_ends 'soon' is not a date"),
        "pin": ({"pin": "helm:kueue"}, "Kueue: pin 'helm:kueue' is not settings:KEY"),
        "setting": ({"pin": "settings:KUEUE_VERSON"}, "Kueue: no setting KUEUE_VERSON in any settings file"),
        "field": ({"homepage": "x"}, "Kueue has unknown fields ['homepage']"),
        "month 13": ({"support_ends": "2027-13"}, "Kueue: support_ends '2027-13' is not a date"),
        "month 0": ({"support_ends": "2027-00"}, "Kueue: support_ends '2027-00' is not a date"),
        "no group": ({"part": "v[0-9.]+"}, "Kueue: part 'v[0-9.]+' needs a group"),
        "bad pattern": ({"part": "(v[0-9.]+"}, "Kueue: part '(v[0-9.]+' is not a pattern"),
        "no pin": ({"pin": None}, "Kueue: pin must be text, got None"),
        "unquoted version": ({"read_for": 3.10}, "Kueue: read_for must be text, got 3.1 (quote a version"),
        "no name": ({"component": None}, "record 5: component must be text, got None"),
    }
    for name, (change, message) in cases.items():
        broken = [dict(record, **change) if record["component"] == "Kueue" else record for record in records]
        path = tmp_path / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(broken))
        done = versions("--releases", str(path))
        assert done.returncode == 2, (name, done.stdout)
        assert message in done.stderr, (name, done.stderr)


def test_a_constraint_is_found_as_pip_would_read_it():
    text = (
        "Keras[jax] == 3.15.1 ; python_version >= '3.10'  # via trainer\nkubeflow_katib_api==0.19.0\nkeras-hub==0.1\n"
    )
    assert constraint(text, "keras") == "3.15.1"
    assert constraint(text, "kubeflow-katib-api") == "0.19.0"
    assert constraint(text, "katib") is None


def test_a_file_that_is_not_text_exits_2(tmp_path):
    path = tmp_path / "releases.yaml"
    path.write_bytes(b"- component: \xff\n")
    done = versions("--releases", str(path))
    assert done.returncode == 2 and "cannot read" in done.stderr

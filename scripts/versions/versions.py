"""`make versions`: every pinned component, its version, when it was released, when its support ends and where it
runs here; a warning for each pin past its support end, and for each pin bumped without its dates read again.

    python -m scripts.versions.versions [--on 2026-12-04] [--markdown]

The versions come from where they are pinned (the settings files' pins, constraints.txt, the Dockerfile); the dates
from releases.yaml beside this file. Warnings never change the exit code (CI prints them and goes on); exit 2 only
when releases.yaml itself cannot be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import pathlib
import re
import sys
from collections.abc import Mapping

import yaml

from scripts.common.packages import normalized
from scripts.common.settings import ROOT, SettingsError, load, room_files

RELEASES = pathlib.Path(__file__).resolve().with_name("releases.yaml")  # resolved, as ROOT is


def release_files() -> list[pathlib.Path]:
    """This room's records, then each tool room's own (scripts/<room>/releases.yaml: the local node's), so that a
    deleted room's pins go with it."""
    return [RELEASES, *(path for path in room_files(RELEASES.name) if path != RELEASES)]


PIN_FILES = {"constraints": ROOT / "constraints.txt", "dockerfile": ROOT / "Dockerfile"}
ENDED = "ended"
FIELDS = ("component", "pin", "read_for", "released", "released_from", "support_ends", "support_from", "runs")
TEXT_FIELDS = ("component", "pin", "read_for", "released_from", "support_from", "runs")


class ReleasesError(ValueError):
    """releases.yaml cannot be used; the message names the record and the fix."""


@dataclasses.dataclass(frozen=True)
class Release:
    component: str
    pin: str
    read_for: str
    released: str | None
    released_from: str
    support_ends: str | None  # YYYY-MM-DD, YYYY-MM, "ended", or None
    support_from: str
    runs: str
    part: str | None = None

    def ended_by(self, day: datetime.date) -> bool:
        if self.support_ends is None:
            return False
        if self.support_ends == ENDED:
            return True
        return last_day(self.support_ends) < day


def last_day(when: str) -> datetime.date:
    """The last day a date (YYYY-MM-DD) or a month (YYYY-MM) covers; ValueError for anything else."""
    if re.fullmatch(r"[0-9]{4}-[0-9]{2}", when):
        first = datetime.date(int(when[:4]), int(when[5:]), 1)  # checks the month
        return (first + datetime.timedelta(days=31)).replace(day=1) - datetime.timedelta(days=1)
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", when):
        raise ValueError(when)
    return datetime.date.fromisoformat(when)


def parse_date(value: object, field: str, component: str) -> str | None:
    if value is None:
        return None
    text = value.isoformat() if isinstance(value, datetime.date) else str(value)
    if field == "support_ends" and text == ENDED:
        return text
    try:
        last_day(text)
    except ValueError:
        allowed = "YYYY-MM-DD, YYYY-MM, ended or null" if field == "support_ends" else "YYYY-MM-DD or null"
        raise ReleasesError(f"{component}: {field} {text!r} is not a date; write {allowed}") from None
    return text


def read_releases(path: pathlib.Path = RELEASES) -> list[Release]:
    try:
        records = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ReleasesError(f"cannot read {path}: {error}") from None
    if not isinstance(records, list):
        raise ReleasesError(f"{path} must be a list of records, each with {', '.join(FIELDS)}")
    releases = []
    for number, record in enumerate(records, 1):
        name = str(record.get("component") or f"record {number}") if isinstance(record, dict) else f"record {number}"
        missing = [field for field in FIELDS if not isinstance(record, dict) or field not in record]
        if missing:
            raise ReleasesError(f"{path}: {name} lacks {', '.join(missing)}")
        unknown = set(record) - set(FIELDS) - {"part"}
        if unknown:
            raise ReleasesError(f"{path}: {name} has unknown fields {sorted(unknown)}; the fields are {FIELDS}")
        for field in TEXT_FIELDS:
            if not isinstance(record[field], str) or not record[field]:
                raise ReleasesError(
                    f"{path}: {name}: {field} must be text, got {record[field]!r} (quote a version: read_for: '3.10')"
                )
        part = record.get("part")
        if part is not None:
            try:
                groups = re.compile(part).groups if isinstance(part, str) else 0
            except re.error as error:
                raise ReleasesError(f"{path}: {name}: part {part!r} is not a pattern ({error})") from None
            if groups < 1:
                raise ReleasesError(f"{path}: {name}: part {part!r} needs a group, (...), around the version")
        fields = {key: str(value) if value is not None else None for key, value in record.items()}
        fields["released"] = parse_date(record["released"], "released", name)
        fields["support_ends"] = parse_date(record["support_ends"], "support_ends", name)
        releases.append(Release(**fields))  # type: ignore[arg-type]
    return releases


@functools.cache
def pin_file(kind: str) -> str:
    """constraints.txt or the Dockerfile, read once however many pins it holds."""
    return PIN_FILES[kind].read_text()


def pinned(release: Release, settings: Mapping[str, str]) -> str:
    """The version the project pins now, read where it is pinned."""
    kind, _, name = release.pin.partition(":")
    if kind == "settings":
        if name not in settings:
            raise ReleasesError(f"{release.component}: no setting {name} in any settings file; fix its pin")
        value = settings[name]
    elif kind == "constraints":
        value = constraint(pin_file(kind), name)
        if value is None:
            raise ReleasesError(f"{release.component}: constraints.txt pins no {name}; fix its pin")
    elif kind == "dockerfile":
        found = re.search(rf"^ARG {re.escape(name)}=(\S+)$", pin_file(kind), re.MULTILINE)
        if not found:
            raise ReleasesError(f"{release.component}: the Dockerfile has no ARG {name} with a default; fix its pin")
        value = found.group(1)
    else:
        raise ReleasesError(
            f"{release.component}: pin {release.pin!r} is not settings:KEY, constraints:PACKAGE or dockerfile:ARG"
        )
    if release.part is None:
        return value
    part = re.search(release.part, value)
    if not part:
        raise ReleasesError(f"{release.component}: part {release.part!r} does not match {value!r}; fix the pattern")
    return part.group(1)


def constraint(text: str, package: str) -> str | None:
    """The version a constraints file pins PACKAGE at (name==version, with extras, a marker or a comment after)."""
    for line in text.splitlines():
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^]]*\])?\s*==\s*([^\s;#]+)", line)
        if found and normalized(found.group(1)) == normalized(package):
            return found.group(3)
    return None


@dataclasses.dataclass(frozen=True)
class Row:
    release: Release
    version: str

    @property
    def cells(self) -> list[str]:
        r = self.release
        support = {None: r.support_from, ENDED: f"ended ({r.support_from})"}.get(
            r.support_ends, f"{r.support_ends} ({r.support_from})"
        )
        released = f"{r.released} ({r.released_from})" if r.released else r.released_from
        return [r.component, self.version, released, support, r.runs]


HEADER = ["component", "version", "released", "support ends", "runs here"]


def rows(releases: list[Release], settings: Mapping[str, str]) -> list[Row]:
    return [Row(release, pinned(release, settings)) for release in releases]


def warnings(table: list[Row], day: datetime.date) -> list[str]:
    found = []
    for row in table:
        r = row.release
        if row.version != r.read_for:
            found.append(
                f"{r.component} is pinned at {row.version}, but its dates were read for {r.read_for}: read its "
                f"release date and support end again and update scripts/versions/releases.yaml"
            )
        elif r.ended_by(day):
            when = "" if r.support_ends == ENDED else f" on {r.support_ends}"
            found.append(f"{r.component} {row.version}: its support ended{when}: {r.support_from}")
    return found


def markdown(table: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row.cells) + " |" for row in table]
    return "\n".join(lines) + "\n"


def plain(table: list[Row]) -> str:
    shown = [HEADER] + [
        [row.release.component, row.version, row.release.released or "-", row.release.support_ends or "-"]
        + [row.release.runs]
        for row in table
    ]
    widths = [max(len(line[column]) for line in shown) for column in range(len(HEADER) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[-1]
        for line in shown
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.versions.versions", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--on",
        type=datetime.date.fromisoformat,
        default=datetime.date.today(),
        help="judge support ends against this day (YYYY-MM-DD; default today)",
    )
    parser.add_argument("--markdown", action="store_true", help="print docs/versions.md's table")
    parser.add_argument("--releases", type=pathlib.Path, action="append", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        releases = [release for path in args.releases or release_files() for release in read_releases(path)]
        table = rows(releases, load())
    except (ReleasesError, SettingsError) as error:
        print(f"versions: error: {error}", file=sys.stderr)
        return 2
    print(markdown(table) if args.markdown else plain(table), end="" if args.markdown else "\n")
    if not args.markdown:
        for line in warnings(table, args.on):
            print(f"warning: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

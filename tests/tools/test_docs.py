"""The docs a reader follows: every relative link in the README and docs/ reaches a file, and its #anchor a heading
there (as GitHub renders the slug); the README stays a front door that fits its promise and still names the paths a
new user takes; docs/trainer.md's flag tables are the parser's flags, each with its variable and default."""

from __future__ import annotations

import argparse
import pathlib
import re
from typing import Any

import pytest

from trainer import context
from trainer.data.datasets import DATASETS
from trainer.settings import flags
from trainer.settings.options import env_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "modules" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_LIMIT = 12_000


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped but hyphens, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(document: pathlib.Path) -> set[str]:
    lines = document.read_text().splitlines()
    fenced = False
    found = set()
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def relative_links(document: pathlib.Path) -> list[str]:
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_the_slug_is_githubs():
    assert slug(" Serving: shedding at the transport, Go load generators (2026-12-02)") == (
        "serving-shedding-at-the-transport-go-load-generators-2026-12-02"
    )
    assert slug(" Benchmark: `make bench`") == "benchmark-make-bench"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_reaches_its_file_and_heading(document):
    broken = []
    for target in relative_links(document):
        path_part, _, anchor = target.partition("#")
        linked = (document.parent / path_part).resolve() if path_part else document
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.relative_to(ROOT)}")
    assert broken == [], f"{document.relative_to(ROOT)} has broken links: {broken}"


# The harness's rooms (docs/design.md): a fork may delete them, and the docs it keeps must not then link to nothing.
HARNESS_FOLDERS = [ROOT / "scripts" / "node", ROOT / "scripts" / "bench"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_page_links_into_a_harness_room_a_fork_deletes(document):
    """The slow room test deletes the harness and checks every link; this says it at once, naming the page."""
    into_harness = [
        target
        for target in relative_links(document)
        if any((document.parent / target.partition("#")[0]).resolve().is_relative_to(room) for room in HARNESS_FOLDERS)
    ]
    assert into_harness == [], (
        f"{document.relative_to(ROOT)} links into the harness ({into_harness}), which a fork deletes: "
        "name the file as code (`scripts/node/...`) instead of linking it"
    )


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme) <= README_LIMIT, (
        f"README.md has {len(readme)} characters, over {README_LIMIT}: move detail to a page under docs/ and link it"
    )
    # The two commands, then the serve, cluster and fork paths, and where to read on.
    for needed in ("make run-local", "make test", "make serve", "make submit", "make cluster-up", "TRAINER_MODULE"):
        assert needed in readme, needed
    unreached = {page.name for page in (ROOT / "docs").glob("*.md")} - pages_reached_from(ROOT / "README.md")
    assert not unreached, f"no link from the README, nor from a page it links, leads to {sorted(unreached)}"


def pages_reached_from(start: pathlib.Path) -> set[str]:
    """The docs/ pages a reader reaches by following links from `start`."""
    reached, pending = set(), [start]
    while pending:
        document = pending.pop()
        for target in relative_links(document):
            linked = (document.parent / target.partition("#")[0]).resolve()
            if linked.parent == ROOT / "docs" and linked.suffix == ".md" and linked.name not in reached:
                reached.add(linked.name)
                pending.append(linked)
    return reached


TRAINER_PAGE = ROOT / "docs" / "trainer.md"
FLAG_ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \|(.*)\|$")  # | `--flag` | variable | default | meaning |


def flag_rows(page: pathlib.Path) -> list[tuple[str, str, str, str, str]]:
    """Each flag row of the page's tables: (flag, the heading above it, variable, default, meaning)."""
    rows, heading = [], ""
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip().replace("`", "")
        elif match := FLAG_ROW.match(line):
            cells = [cell.strip() for cell in match.group(2).split("|", 2)]
            variable, default, meaning = (cells + ["", ""])[:3]  # a row short of columns reads as empty cells
            rows.append((match.group(1), heading, variable.strip("`"), default, meaning))
    return rows


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    """The parser `python -m trainer --help` prints, without a module or variables: the core's, the built-in dataset
    kinds' and the default task's flags."""
    core = context.read_core([], {}).config
    # Other tests register forks' datasets in this process; the page documents the trainer's own.
    groups = [
        group
        for group in context.option_groups(*context.chosen_task(core))
        if group[1].__module__.startswith("trainer.")
    ]
    return flags.build_parser({}, groups)


def parser_flags(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.Action]]:
    """Each flag the parser accepts (a switch by its positive form) -> (its heading in --help, its action)."""
    return {
        action.option_strings[0]: (group.title, action)
        for group in parser._action_groups
        for action in group._group_actions
        if action.dest != "help"  # argparse's own, with no variable
        and action.help != argparse.SUPPRESS  # an older name that keeps working, out of --help and the docs
    }


def stated_default(cell: str, default: Any) -> Any:
    """The value a default cell states: its leading `value` (`on`/`off` for a switch), else unset ("")."""
    match = re.match(r"`([^`]*)`", cell)
    if match is None:
        return ""
    text = match.group(1)
    if isinstance(default, bool):
        return {"on": True, "off": False}.get(text, text)
    try:
        return type(default)(text)
    except ValueError:
        return text


def test_the_flag_tables_list_every_flag_the_parser_accepts_and_no_other(parser):
    documented = [row[0] for row in flag_rows(TRAINER_PAGE)]
    accepted = parser_flags(parser)
    wrong = [
        f"no row for {flag} (under '{title}' in --help)"
        for flag, (title, _) in accepted.items()
        if flag not in documented
    ]
    wrong += [
        f"a row for {flag}, which python -m trainer does not accept" for flag in documented if flag not in accepted
    ]
    wrong += [
        f"{documented.count(flag)} rows for {flag}" for flag in sorted(set(documented)) if documented.count(flag) > 1
    ]
    assert wrong == [], f"docs/trainer.md's flag tables are not the parser's flags: {wrong}"


def test_each_flag_row_has_the_parsers_heading_variable_and_default(parser):
    accepted = parser_flags(parser)
    wrong = []
    for flag, heading, variable, default, _ in flag_rows(TRAINER_PAGE):
        if flag not in accepted:
            continue  # the test above names it
        title, action = accepted[flag]
        if not heading.startswith(title):
            wrong.append(f"{flag} is under the heading '{heading}', but --help lists it under '{title}'")
        if variable != env_name(action.dest):
            wrong.append(f"{flag}: the page says its variable is {variable}, the parser reads {env_name(action.dest)}")
        if stated_default(default, action.default) != action.default:
            wrong.append(f"{flag}: the page says its default is {default!r}, the parser's is {action.default!r}")
    assert wrong == [], f"docs/trainer.md differs from the parser: {wrong}"


def test_the_dataset_row_names_every_built_in_dataset_kind():
    meaning = {row[0]: row[4] for row in flag_rows(TRAINER_PAGE)}["--dataset"]
    built_in = sorted(name for name, build in DATASETS.items() if build.__module__.startswith("trainer.data."))
    unnamed = [name for name in built_in if f"`{name}`" not in meaning]
    assert built_in and unnamed == [], f"docs/trainer.md's --dataset row does not name the dataset kinds {unnamed}"


DESIGN_PAGE = ROOT / "docs" / "design.md"
CONCEPT_ROW = re.compile(r"^\| `(trainer/[\w/.]*)` \|(.*)\|$")  # | `trainer/file.py` or `trainer/room/` | job |


def concept_table(page: pathlib.Path = DESIGN_PAGE) -> dict[str, str]:
    """design.md's table of concepts: each row's file or room -> its job."""
    return {
        match.group(1): match.group(2) for line in page.read_text().splitlines() if (match := CONCEPT_ROW.match(line))
    }


def unnamed_in(table: dict[str, str], trainer: pathlib.Path) -> list[str]:
    """The trainer's modules that no row names: by their own row, or by `name.py` in their room's row."""
    unnamed = []
    for path in sorted(trainer.rglob("*.py")):
        relative = path.relative_to(trainer.parent).as_posix()
        room = f"{path.parent.relative_to(trainer.parent).as_posix()}/"
        # A package's __init__ is its room, which its folder's row names.
        if path.name == "__init__.py" or relative in table:
            continue
        if f"`{path.name}`" not in table.get(room, ""):
            unnamed.append(relative)
    return unnamed


def test_the_concept_table_names_every_module_of_the_trainer():
    unnamed = unnamed_in(concept_table(), ROOT / "trainer")
    assert unnamed == [], f"docs/design.md's table of concepts names no row for {unnamed}: add each with its job"


def test_a_module_missing_from_the_concept_table_is_seen(tmp_path):
    (tmp_path / "trainer" / "data").mkdir(parents=True)
    for name in ("loop.py", "data/__init__.py", "data/pipeline.py", "data/new_kind.py", "new_story.py"):
        (tmp_path / "trainer" / name).write_text("")
    table = {"trainer/loop.py": " the one loop ", "trainer/data/": " `pipeline.py` (one worker's input) "}
    assert unnamed_in(table, tmp_path / "trainer") == ["trainer/data/new_kind.py", "trainer/new_story.py"]


FORK_PAGE = ROOT / "docs" / "fork.md"
NUMBERS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


def files_the_example_needs() -> set[str]:
    """The example, this page, trainer.api and each file that defines a name the example imports from it."""
    import importlib
    import inspect

    api = importlib.import_module("trainer.api")
    (line,) = [
        line for line in (ROOT / "examples" / "regression.py").read_text().splitlines() if "from trainer.api" in line
    ]
    names = [name.strip() for name in line.split(" import ", 1)[1].split(",")]
    defining = {pathlib.Path(inspect.getfile(getattr(api, name))).relative_to(ROOT).as_posix() for name in names}
    return {"docs/fork.md", "examples/regression.py", "trainer/api.py", *defining}


def test_fork_md_reading_list_is_what_the_example_needs():
    text = FORK_PAGE.read_text()
    match = re.search(r"read (\w+) files, what the example below needs: this page,(.*?)\. Then", text, re.S)
    assert match, "docs/fork.md no longer says which files a forker reads"
    listed = {"docs/fork.md", *re.findall(r"`([\w/]+\.py)`", match.group(2))}
    needed = files_the_example_needs()
    assert listed == needed, f"fork.md lists {sorted(listed)}; examples/regression.py needs {sorted(needed)}"
    assert match.group(1) == NUMBERS[len(needed)], f"fork.md says {match.group(1)} files; the list has {len(needed)}"

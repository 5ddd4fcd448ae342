"""The docs a reader follows: every relative link in the README and docs/ reaches a file, and its #anchor a heading
there (as GitHub renders the slug); the README stays a front door that fits its promise and still names the paths a
new user takes."""

from __future__ import annotations

import pathlib
import re

import pytest

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

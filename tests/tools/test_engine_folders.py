"""The engines are their folders: k8s/engines/<engine>/engine.env makes one, and the tools (the registry, the
Makefile, the install) find them there rather than in lists of their own."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import yaml

import engines_here
from scripts.common import engine_folders, manifest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_shipped_engines_are_found_from_their_folders_the_default_first():
    found = engine_folders.engines()
    assert list(found)[0] == engine_folders.DEFAULT == "tfjob"
    shipped = {"tfjob": "TFJob", "jobset": "JobSet", "trainjob": "TrainJob"}  # a fork may delete all but tfjob
    assert {name: engine.kind for name, engine in found.items()} == {name: shipped[name] for name in found}
    assert manifest.ENGINES == tuple(found) and manifest.ENGINE_KINDS == engine_folders.kinds()
    for engine in found.values():
        assert (engine.folder / "install.sh").is_file(), engine.name
        for strategy in engine_folders.STRATEGIES:
            assert (engine.overlay(strategy) / "kustomization.yaml").is_file(), (engine.name, strategy)


@engines_here.needs("jobset", "trainjob")
def test_an_engine_goes_with_the_engines_built_on_it():
    assert engine_folders.dependents("jobset") == ["jobset", "trainjob"]
    assert engine_folders.dependents("trainjob") == ["trainjob"]


def test_an_engines_kustomizations_reach_only_its_folder_the_base_its_engines_and_the_add_ons():
    """What an overlay renders of an engine is in the engine's folder: its pod templates get the trainer's pod from
    its own component (<engine>/trainer-pod, its kind's paths), not from one that lists every kind."""
    engines = engine_folders.engines()
    add_ons = {path.name for path in engine_folders.ENGINES_DIR.iterdir() if path.is_dir() and path.name not in engines}
    for engine in engines.values():
        allowed = {engine.name, *engine.requires, *add_ons}
        for kustomization in engine.folder.rglob("kustomization.yaml"):
            parsed = yaml.safe_load(kustomization.read_text())
            for entry in (*parsed.get("resources", ()), *parsed.get("components", ())):
                if "://" in entry or entry.startswith("github.com/"):
                    continue  # an install's upstream source
                reached = (kustomization.parent / entry).resolve()
                if reached.is_relative_to(ROOT / "k8s" / "base"):
                    continue
                assert reached.is_relative_to(engine_folders.ENGINES_DIR), (kustomization, entry)
                assert reached.relative_to(engine_folders.ENGINES_DIR).parts[0] in allowed, (kustomization, entry)
    assert not (ROOT / "k8s" / "components").exists()  # the trainer's pod was copied from there into every kind


def test_adding_an_engine_is_adding_a_folder(tmp_path):
    root = tmp_path / "engines"
    shutil.copytree(engine_folders.ENGINES_DIR / "tfjob", root / "tfjob")
    (root / "mine").mkdir()
    (root / "mine" / "engine.env").write_text("# one of mine\nENGINE_KIND=MyJob\nENGINE_REQUIRES=tfjob\n")
    (root / "not-an-engine").mkdir()  # an add-on's install (Kueue, Katib): no engine.env
    found = engine_folders.engines(root)
    assert list(found) == ["tfjob", "mine"] and found["mine"].requires == ("tfjob",)


def test_make_and_the_install_name_the_engines_the_folders_hold():
    refused = subprocess.run(["make", "-n", "run-local", "ENGINE=nope"], capture_output=True, text=True, cwd=ROOT)
    assert f"use one of {' '.join(manifest.ENGINES)} (" in refused.stderr, refused.stderr
    script = "source scripts/cluster/install-engines.sh; check_engine nope"
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert shell.returncode == 2 and f"use one of {' '.join(sorted(manifest.ENGINES))}" in shell.stderr, shell.stderr

"""The engines are their folders: k8s/engines/<engine>/engine.env makes one, and the tools (the registry, the
Makefile, the install) find them there rather than in lists of their own."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

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

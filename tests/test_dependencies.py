"""Dependency bounds that mean something: every floor of a generated project is a version CI installs and tests
(.ci/floors.txt, which .ci/run installs exactly), and lightning's floor refuses the releases before 2.6.6, whose
load_from_checkpoint ran code a checkpoint named (CVE-2026-58659), 2.6.2 and 2.6.3 (malicious uploads) among them."""

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from bakery import PRESETS, REPO, TEMPLATE, preset_context

FLOORS = {
    Requirement(line).name: str(next(iter(Requirement(line).specifier)).version)
    for line in (REPO / ".ci" / "floors.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


def requirements(pyproject: Path) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = [line for lines in project.get("optional-dependencies", {}).values() for line in lines]
    return [Requirement(line) for line in [*project["dependencies"], *extras]]


@pytest.fixture(params=[p for p in PRESETS if p.stem in ("default", "char_lm")], ids=lambda p: p.stem)
def baked_pyproject(request, cookies) -> Path:
    result = cookies.bake(extra_context=preset_context(request.param), template=str(TEMPLATE))
    assert result.exit_code == 0, result.exception
    return result.project_path / "pyproject.toml"


def test_every_floor_is_a_version_ci_installs(baked_pyproject):
    for pyproject in (baked_pyproject, REPO / "pyproject.toml"):
        for requirement in requirements(pyproject):
            floors = [spec.version for spec in requirement.specifier if spec.operator == ">="]
            assert floors == [FLOORS[requirement.name]], f"{pyproject}: {requirement}"
            assert not [spec for spec in requirement.specifier if spec.operator not in (">=",)], requirement


def test_lightning_before_2_6_6_is_refused(baked_pyproject):
    [lightning] = [r for r in requirements(baked_pyproject) if r.name == "lightning"]
    assert not any(lightning.specifier.contains(v) for v in ("2.6.2", "2.6.3", "2.6.4", "2.6.5"))
    assert lightning.specifier.contains("2.6.6") and lightning.specifier.contains("2.7.0")

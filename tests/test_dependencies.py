"""Dependency bounds that mean something: every floor of a generated project is a version CI installs and tests
(.ci/floors.txt, which .ci/run installs exactly, through the README's own test command), lightning's floor refuses the
releases before 2.6.6, whose load_from_checkpoint ran code a checkpoint named (CVE-2026-58659), 2.6.2 and 2.6.3
(malicious uploads) among them, and the bound in constraints.txt is the one that spares pip its backtrack."""

import importlib.metadata
import re
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
CONSTRAINTS = {
    Requirement(line).name: Requirement(line).specifier
    for line in (REPO / "constraints.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


def readme_commands() -> tuple[str, str]:
    """The README's two commands: scaffold, install and train; the template's tests."""
    chapter = (REPO / "README.md").read_text().split("## The two commands", 1)[1].split("\n## ", 1)[0]
    first, second = re.findall(r"```bash\n(.*?)\n```", chapter, re.S)
    return first, second


def bounds(specifier) -> dict[str, str]:
    return {spec.operator: spec.version for spec in specifier}


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


def test_the_boto3_bound_admits_the_releases_whose_botocore_s3fs_accepts():
    """boto3 X.Y.Z needs botocore >=X.Y.Z,<X.Y+1: the bound is aiobotocore's botocore range (s3fs's), or pip backtracks
    through boto3's releases (above it) or installs one aiobotocore refuses (below it)."""
    [botocore] = [r for r in map(Requirement, importlib.metadata.requires("aiobotocore")) if r.name == "botocore"]
    assert bounds(CONSTRAINTS["boto3"]) == bounds(botocore.specifier), f"constraints.txt: boto3 against {botocore}"
    assert FLOORS["boto3"] == bounds(CONSTRAINTS["boto3"])[">="]  # CI installs the bound's floor


def test_ci_runs_the_readmes_test_command_with_every_floor():
    first, second = readme_commands()
    scaffold = first.split(" && cookiecutter ", 1)[0]
    assert scaffold.endswith("&& pip install cookiecutter"), first  # baking takes cookiecutter alone
    install = next(part for part in second.split(" && ") if part.startswith("pip install "))
    assert "-c constraints.txt" in install, second
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert f"pip install -q -c .ci/floors.txt {install.removeprefix('pip install ')}" in ci, install
    assert second.endswith("&& pytest") and ci[-1] == "pytest"

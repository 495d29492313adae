"""READMEs that a newcomer reads to the end: the generated one short, its chapter on your own model and data a
minimal example that trains as written, every paragraph of either README readable at a glance, every link leading
to a file of the project."""

import re
import sys
import textwrap
from pathlib import Path

import pytest

from bakery import PRESETS, REPO, TEMPLATE, preset_context, run

MOST_WORDS = 120  # in a paragraph
MOST_LINES, CHAPTER_LINES = 300, 80  # in the generated README, in its chapter "Your own model and data"
OWN_CHAPTER = "## Your own model and data"


def paragraphs(markdown: str) -> list[str]:
    """The prose of a markdown text: blocks of lines between blank lines, a list item each on its own, without code
    blocks, tables, headings and Jinja line statements."""
    found, current, in_code = [], [], False

    def close() -> None:
        if current:
            found.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = not in_code
            close()
            continue
        if in_code or not stripped or stripped.startswith(("|", "#")):
            close()
            continue
        if re.match(r"(-|\d+\.) ", stripped):
            close()
        current.append(stripped)
    close()
    return found


def chapter(readme: str, heading: str) -> str:
    return heading + readme.split(heading, 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module", params=[p for p in PRESETS if p.stem in ("default", "char_lm")], ids=lambda p: p.stem)
def baked(request, tmp_path_factory) -> tuple[Path, dict]:
    from cookiecutter.main import cookiecutter

    context = preset_context(request.param)
    output = tmp_path_factory.mktemp(request.param.stem)
    project = cookiecutter(str(TEMPLATE), no_input=True, extra_context=context, output_dir=str(output))
    return Path(project), context


def long_paragraphs(text: str) -> list[str]:
    return [f"{len(p.split())} words: {p[:80]}..." for p in paragraphs(text) if len(p.split()) > MOST_WORDS]


def test_no_paragraph_of_the_templates_readme_is_longer_than_a_glance():
    assert not long_paragraphs((REPO / "README.md").read_text())


def test_the_generated_readme_is_short_and_its_paragraphs_too(baked):
    project, _ = baked
    readme = (project / "README.md").read_text()
    assert len(readme.splitlines()) <= MOST_LINES
    assert len(chapter(readme, OWN_CHAPTER).splitlines()) <= CHAPTER_LINES
    assert not long_paragraphs(readme)


def test_every_link_of_the_generated_readme_and_docs_leads_to_a_file(baked):
    project, _ = baked
    for page in [project / "README.md", *(project / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} links to {target}, which is not there"


def test_the_readmes_own_model_and_data_train_as_written(baked):
    """The chapter's code saved where it says, and its fit command run as written (a few epochs): it trains."""
    project, context = baked
    if context.get("task", "image_classifier") != "image_classifier":
        pytest.skip("the same chapter in every project: trained once, in the default one")
    own = chapter((project / "README.md").read_text(), OWN_CHAPTER)
    code = textwrap.dedent(re.search(r"```python\n(.*?)```", own, re.S).group(1))
    module = re.search(r"Save this as `(src/[\w/]+\.py)`", own).group(1)
    (project / module).write_text(code)
    command = next(line.strip() for line in own.splitlines() if line.strip().startswith("python -m"))
    args = command.split()[1:]
    quick = ["--trainer.max_epochs=3", "--trainer.enable_progress_bar=false"]
    result = run([sys.executable, *args, *quick], cwd=project, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(re.search(r"val/acc (\d\.\d+) at the end", result.stdout).group(1))
    assert accuracy > 0.8, result.stdout
    assert (project / "runs" / "mytask" / "checkpoints" / "last.ckpt").is_file()

"""The engine is a room of its own: it imports nothing of the example, and copied whole into another project it
runs that project's own model and data (its CLI, exact resume, durable checkpoints) without this package."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch
import yaml
from torch.utils.data import DataLoader

import template_package
from template_package.engine import ExactResume
from template_package.engine.cli.main import DEFAULT_CONFIG_VARIABLE

ENGINE = Path(template_package.__path__[0]) / "engine"

THEIR_MODEL = '''
import torch
import torch.nn.functional as F
from lightning import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from .engine import TrainingRecipe


class Regressor(TrainingRecipe):
    """Fits y = 3x - 1 with one linear layer: a model that is not a classifier, with dict batches."""

    def __init__(self, **recipe) -> None:
        super().__init__(**recipe)
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.layer(batch["x"]), batch["y"])

    def validation_step(self, batch, batch_idx):
        self.log("val/mse", F.mse_loss(self.layer(batch["x"]), batch["y"]))


class Points(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.linspace(-1, 1, n).unsqueeze(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i] + 0.01 * torch.randn(1)  # drawn per sample: seeded by the engine from (seed, epoch, index)
        return {"x": x, "y": 3 * x - 1}


class PointsData(LightningDataModule):
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(Points(256), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(Points(64), batch_size=64)
'''

THEIR_CONFIG = """
model:
  class_path: their_project.model.Regressor
  init_args:
    lr: 0.3
data:
  class_path: their_project.model.PointsData
checkpoint:
  monitor: val/mse
  mode: min
"""  # their classes and their metric only: the engine's defaults (seed, determinism, clipping, loggers) are its own


def engine_imports() -> dict[str, set[str]]:
    """Each engine module (dotted, relative to the engine) and the engine modules it imports at its top level."""
    graph = {}
    for source in ENGINE.rglob("*.py"):
        parts = source.relative_to(ENGINE).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__").removesuffix("__init__")
        package = parts[:-1]
        graph[name] = set()
        for node in ast.parse(source.read_text()).body:
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                assert not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("template_package")
                continue
            assert node.level <= len(package) + 1, f"{source} imports from outside the engine: {ast.unparse(node)}"
            base = [*package[: len(package) - node.level + 1], *(node.module or "").split(".")]
            graph[name].add(".".join(part for part in base if part))
    return graph


def test_the_engine_imports_nothing_outside_itself_and_has_no_import_circle():
    graph = engine_imports()
    assert "training.recipe" in graph and "cli.main" in graph  # its rooms

    def visit(module: str, path: tuple[str, ...]) -> None:
        for imported in graph.get(module, ()):
            assert imported not in path, f"an import circle: {' -> '.join((*path, imported))}"
            visit(imported, (*path, imported))

    for module in graph:
        visit(module, (module,))
    for source in ENGINE.rglob("*.py"):  # nothing of the package around it, at any depth
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                outside = [n for n in names if (n or "").split(".")[0] == ENGINE.parent.name]
                assert not outside, f"{source}: {ast.unparse(node)}"


def copied_engine(tmp_path: Path) -> tuple[Path, dict]:
    """The engine copied into another project with a model and data of its own; the project and its environment."""
    project = tmp_path / "their_repo"
    package = project / "src" / "their_project"
    shutil.copytree(ENGINE, package / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("from .engine.cli.main import main\n\nmain()\n")
    (package / "model.py").write_text(THEIR_MODEL)
    (project / "configs").mkdir()
    (project / "configs" / "default.yaml").write_text(THEIR_CONFIG)
    env = {name: value for name, value in os.environ.items() if name != DEFAULT_CONFIG_VARIABLE}  # (their own config)
    return project, {**env, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}  # not this src/


def their_command(project: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "their_project", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_the_engine_copied_into_another_project_trains_its_own_model_with_the_engines_defaults(tmp_path):
    """A config naming only their classes and their metric: the engine's seed, determinism, clipping, run directory
    and TensorBoard layout all hold, and a resumed run goes on in the same TensorBoard run."""
    project, env = copied_engine(tmp_path)
    run_dir = tmp_path / "run"
    fit = their_command(project, env, "fit", f"--trainer.default_root_dir={run_dir}", "--trainer.max_epochs=4",
                        "--trainer.enable_progress_bar=false")  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "notice" not in fit.stderr
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["_class_path"] == "their_project.model.Regressor"
    assert checkpoint["global_step"] == 4 * 16 and "rng_states" in checkpoint
    weight, bias = checkpoint["state_dict"]["layer.weight"].item(), checkpoint["state_dict"]["layer.bias"].item()
    assert abs(weight - 3) < 0.3 and abs(bias + 1) < 0.3, (weight, bias)
    assert list((run_dir / "checkpoints").glob("epoch=*-val_mse=*.ckpt"))  # the best by their own metric
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert "template_package" not in (run_dir / "config.yaml").read_text()
    assert config["seed_everything"] == 42 and config["trainer"]["deterministic"] is True
    assert config["trainer"]["gradient_clip_val"] == 1.0 and config["trainer"]["gradient_clip_algorithm"] == "norm"
    assert [c["class_path"] for c in config["trainer"]["callbacks"]] == [
        "their_project.engine.report.progress.TimedProgressBar",
        "their_project.engine.report.throughput.Throughput",
    ]
    events = sorted(run_dir.glob("events.out.tfevents.*"))
    resumed = their_command(project, env, "fit", f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last",
                            "--trainer.max_epochs=5", "--trainer.enable_progress_bar=false")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(sorted(run_dir.glob("events.out.tfevents.*"))) == len(events) + 1  # the same TensorBoard run
    assert not list(run_dir.rglob("version_*")) and not (project / "lightning_logs").exists()


def test_the_guarantee_kit_runs_in_the_copied_engine(tmp_path):
    project, env = copied_engine(tmp_path)
    kit = their_command(project, env, "guarantees", f"--folder={tmp_path / 'kit'}")
    assert kit.returncode == 0, kit.stdout + kit.stderr[-3000:]
    assert kit.stdout.splitlines() == ["passed: repeatable", "passed: exact resume"]  # (their data takes no workers)


def test_the_engines_requirements_are_the_projects_dependencies_but_the_examples():
    import tomllib

    requirements = [line for line in (ENGINE / "requirements.txt").read_text().splitlines()
                    if line and not line.startswith("#")]  # fmt: skip
    project = tomllib.loads((ENGINE.parents[2] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert set(requirements) <= set(project)
    assert {dependency.split(">=")[0] for dependency in set(project) - set(requirements)} <= {
        "torchvision",
        "scikit-learn",
    }  # (the image classifier example's)


def test_resume_modules_keep_last_ckpt_with_a_bare_trainer(tmp_path):
    """ExactResume in a plain Lightning Trainer, with a plain LightningModule of Lightning's own."""
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset

    L.seed_everything(0)
    callbacks = [ExactResume(str(tmp_path / "ckpt"), every_n_steps=5)]
    # (ExactResume is a Lightning Checkpoint: with it, Lightning adds no ModelCheckpoint of its own.)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, callbacks=callbacks,
                        limit_train_batches=6, limit_val_batches=0)  # fmt: skip
    trainer.fit(BoringModel(), DataLoader(RandomDataset(32, 64), batch_size=2))
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 12 and "rng_states" in checkpoint
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [  # (the run's .lock is beside it)
        "last.ckpt", "last.ckpt.crc32", "previous.ckpt", "previous.ckpt.crc32"
    ]  # fmt: skip

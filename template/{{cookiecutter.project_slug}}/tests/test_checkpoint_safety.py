"""Checkpoints never choose code: validate, test, predict, export and fit --ckpt_path build the classes the command
line and config files name. A checkpoint whose hyperparameters name another class or an instantiator (the way
LightningCLI's subclass mode and releases of Lightning before 2.6.6 let a checkpoint pick the code that runs,
CVE-2026-58659) stops with one line, and nothing it names runs; one that records no class still loads."""

import pytest
import torch

from template_package.engine.cli import export

from helpers.cli import QUICK, cli

# What a crafted checkpoint could ask to run: each would create the marker file if it ran.
CRAFTED = {
    "popen_class": {"_class_path": "subprocess.Popen", "args": ["touch", "{marker}"]},
    "system_class": {"_class_path": "os.system", "command": "touch {marker}"},
    "exec_class": {"_class_path": "builtins.exec", "source": "open('{marker}', 'w')"},
    "system_instantiator": {"_instantiator": "os.system", "command": "touch {marker}"},
    "exec_instantiator": {"_instantiator": "builtins.exec", "source": "open('{marker}', 'w')"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    return run_dir


def crafted(trained, tmp_path, section: str, name: str):
    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    marker = tmp_path / "it-ran"
    key = "hyper_parameters" if section == "model" else "datamodule_hyper_parameters"
    planted = {k: (v.replace("{marker}", str(marker)) if isinstance(v, str) else
                   [x.replace("{marker}", str(marker)) for x in v] if isinstance(v, list) else v)
               for k, v in CRAFTED[name].items()}  # fmt: skip
    checkpoint[key] = {k: v for k, v in checkpoint[key].items() if k not in ("_class_path", "_instantiator")}
    checkpoint[key].update(planted)
    path = tmp_path / f"{name}.ckpt"
    torch.save(checkpoint, path)
    return path, marker


COMMANDS = {
    "validate": lambda ckpt, run_dir: cli("validate", f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={ckpt}"),
    "test": lambda ckpt, run_dir: cli("test", f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={ckpt}"),
    "predict": lambda ckpt, run_dir: cli("predict", f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={ckpt}"),
    "fit": lambda ckpt, run_dir: cli("fit", f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={ckpt}", *QUICK),
    "export": lambda ckpt, run_dir: export.main(
        [
            f"--ckpt_path={ckpt}",
            f"--output={run_dir / 'model.pt2'}",
            "--model=helpers.stand_in.StandInClassifier",
            "--data=helpers.stand_in.StandInData",
        ]
    ),  # fmt: skip
}


# Every crafted checkpoint, in the model's and the data's hyperparameters, for validate; every other command with a
# class in the model's and an instantiator in the data's (they share the path: the CLI's checkpoint checks).
CASES = [("validate", name, section) for name in CRAFTED for section in ("model", "data")] + [
    (command, name, section) for command in COMMANDS if command != "validate"
    for name, section in (("popen_class", "model"), ("system_instantiator", "data"))
]  # fmt: skip


@pytest.mark.parametrize("command, name, section", CASES, ids=["-".join(case) for case in CASES])
def test_a_checkpoint_naming_code_runs_nothing_and_gets_one_line(trained, tmp_path, command, name, section):
    ckpt, marker = crafted(trained, tmp_path, section, name)
    with pytest.raises(SystemExit) as stop:
        COMMANDS[command](ckpt, tmp_path / "run")
    message = str(stop.value.code)
    assert message.startswith(f"error: --ckpt_path {ckpt} ") and "\n" not in message, message
    named = CRAFTED[name].get("_class_path") or CRAFTED[name]["_instantiator"]
    assert named in message and (section in message)
    assert not marker.exists()


def test_another_class_of_the_project_is_named_too(trained, tmp_path):
    """A checkpoint of the example given to a command that builds the stand-in: both classes in one line."""
    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["_class_path"] = "template_package.classifier.model.ImageClassifier"
    torch.save(checkpoint, tmp_path / "other.ckpt")
    with pytest.raises(SystemExit) as stop:
        cli("validate", f"--trainer.default_root_dir={tmp_path / 'run'}", f"--ckpt_path={tmp_path / 'other.ckpt'}")
    assert str(stop.value.code) == (
        f"error: --ckpt_path {tmp_path / 'other.ckpt'} holds a model of class "
        "template_package.classifier.model.ImageClassifier, and this command builds "
        "helpers.stand_in.StandInClassifier: "
        "give the run's own config (-c <run dir>/config.yaml) or --model with its class, or a checkpoint of this class"
    )


def test_a_checkpoint_that_records_no_class_still_loads(trained, tmp_path):
    """Written by an older release: no _class_path, no _instantiator. Class paths compare below the package name,
    which a generated project renames."""
    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        checkpoint[key].pop("_class_path"), checkpoint[key].pop("_instantiator")
    torch.save(checkpoint, tmp_path / "old.ckpt")
    result = cli("validate", f"--trainer.default_root_dir={tmp_path / 'run'}", f"--ckpt_path={tmp_path / 'old.ckpt'}")
    assert "val/acc" in result.trainer.callback_metrics
    checkpoint["hyper_parameters"]["_class_path"] = "renamed_project.stand_in.StandInClassifier"  # another package name
    torch.save(checkpoint, tmp_path / "renamed.ckpt")
    cli("validate", f"--trainer.default_root_dir={tmp_path / 'run'}", f"--ckpt_path={tmp_path / 'renamed.ckpt'}")


def test_an_object_to_build_is_never_taken_from_a_checkpoint(trained, tmp_path):
    """A hyperparameter whose value describes an object (a class_path in it) keeps the config's value."""
    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    marker = tmp_path / "it-ran"
    checkpoint["hyper_parameters"]["dropout"] = {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}
    torch.save(checkpoint, tmp_path / "object.ckpt")
    result = cli(
        "validate", f"--trainer.default_root_dir={tmp_path / 'run'}", f"--ckpt_path={tmp_path / 'object.ckpt'}"
    )
    assert result.model.hparams.dropout == 0.0 and not marker.exists()

"""A model or DataModule class switched on the command line or in a config file starts from its own defaults.

jsonargparse carries the previous class's values (its defaults included) over to a new class for arguments of the
same name: `fit --model a.b.MyModel` would silently train with the example's `dropout` and `batch_size`. The engine
sets the section to null right before each switch, which makes jsonargparse start the new class from nothing; values
given after the switch (`--model a.b.MyModel --model.dropout 0.3`, or in a later config) still apply.

Depends on PyYAML.
"""

from pathlib import Path

import yaml

SECTIONS = ("model", "data")
CONFIG_FLAGS = ("-c", "--config")


def with_own_defaults(args: list[str], classes: dict[str, str | None]) -> list[str]:
    """`args` with `--<section>=null` before every option or config file that names another class for a section.

    classes: each section's class path before `args` apply (the default config's)."""
    current, out, i = dict(classes), [], 0
    while i < len(args):
        token = args[i]
        flag, _, inline = token.partition("=")
        takes_value = flag in CONFIG_FLAGS or flag.removesuffix(".class_path") in [f"--{s}" for s in SECTIONS]
        value = inline if "=" in token else args[i + 1] if takes_value and i + 1 < len(args) else None
        step = 1 if "=" in token or not takes_value else 2
        for section, class_path in classes_named(flag, value).items():
            if class_path is not None and not same_class(class_path, current.get(section)):
                out.append(f"--{section}=null")
            current[section] = class_path
        out.extend(args[i : i + step])
        i += step
    return out


def classes_named(flag: str, value: str | None) -> dict[str, str | None]:
    """The class path each section gets from one option: `--model X`, `--model.class_path X`, `--model '{...}'`, or
    a config file's `model: {class_path: X}`."""
    if value is None:
        return {}
    if flag in CONFIG_FLAGS:
        path = Path(value)
        try:
            content = yaml.safe_load(path.read_text()) if path.is_file() else None
        except yaml.YAMLError:
            content = None  # the parser names the broken file
        sections = content if isinstance(content, dict) else {}
        return {s: class_path_of(sections[s]) for s in SECTIONS if s in sections and has_class_path(sections[s])}
    for section in SECTIONS:
        if flag in (f"--{section}", f"--{section}.class_path"):
            parsed = yaml.safe_load(value) if value.lstrip().startswith("{") else value
            if parsed is None or value == "null":
                return {section: None}
            if isinstance(parsed, str) or has_class_path(parsed):
                return {section: class_path_of(parsed)}
    return {}


def has_class_path(spec: object) -> bool:
    return isinstance(spec, str) or (isinstance(spec, dict) and "class_path" in spec)


def class_path_of(spec: str | dict) -> str:
    return spec if isinstance(spec, str) else spec["class_path"]


def same_class(a: str | None, b: str | None) -> bool:
    """Whether two class paths name the same class: jsonargparse takes a class's short name too (`ImageClassifier`)."""
    if a is None or b is None:
        return a is b
    return a == b or a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1] and ("." not in a or "." not in b)


def default_classes(config: Path | None) -> dict[str, str | None]:
    """The class path each section has in the default config (None: none named)."""
    content = yaml.safe_load(config.read_text()) if config is not None else None
    sections = content if isinstance(content, dict) else {}
    return {s: class_path_of(sections[s]) if has_class_path(sections.get(s)) else None for s in SECTIONS}

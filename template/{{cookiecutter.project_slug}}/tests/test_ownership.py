"""The engine stays simple enough to own: another library's private names go through engine/internals.py alone (its
overrides of private methods and subclasses of private classes are listed there), and the engine's docstrings, comments
and help texts say rules and reasons, not timings (figures live in benchmarks/)."""

import ast
import importlib
import importlib.util
import inspect
import io
import re
import tokenize
from pathlib import Path

import template_package
from template_package.engine import internals

ENGINE = Path(template_package.__path__[0]) / "engine"
PACKAGE = template_package.__name__
# Private-looking names that are documented public API: os._exit, and namedtuple's methods.
PUBLIC_WITH_UNDERSCORE = {"_exit", "_replace", "_asdict", "_fields", "_make"}
ACCESSORS = {"getattr", "hasattr", "setattr"}
TIMING = re.compile(
    r"\bmeasured\b|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:ms|us|µs|s|sec|min|seconds?|minutes?|hours?)\b"
)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_WITH_UNDERSCORE


def is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def engine_files() -> list[Path]:
    return sorted(path for path in ENGINE.rglob("*.py") if "__pycache__" not in path.parts)


def names_the_engine_defines(trees: list[ast.AST]) -> set[str]:
    """Private names of the engine's own: its functions, classes, module names and attributes set on self/cls."""
    defined = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_self(node.value):
                defined.add(node.attr)
    return {name for name in defined if is_private(name)}


def foreign_private_names(tree: ast.AST, own: set[str]) -> set[str]:
    """Another library's private names a module uses: imported (from internals.py too, a private class it re-exports),
    read or written as attributes, or named to getattr."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if any(map(is_private, node.module.split("."))):
                found.add(f"from {node.module}")
            found |= {f"{node.module}.{alias.name}" for alias in node.names if is_private(alias.name)}
        elif isinstance(node, ast.ImportFrom) and node.module == "internals":
            found |= {f"internals.{alias.name}" for alias in node.names if is_private(alias.name)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if any(map(is_private, alias.name.split(".")))}
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in own:
            found.add(f".{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS:
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value):
                found.add(f".{name.value}" if name.value not in own else None)
    return found - {None}


def foreign_private_overrides(module_name: str) -> dict[str, object]:
    """The module's classes' overrides of another library's private methods ("Class.method") and their bases that are
    another library's private classes ("Class(Base)"), each with the library's method or class."""
    module = importlib.import_module(module_name)
    found = {}
    for cls in vars(module).values():
        if not (inspect.isclass(cls) and cls.__module__ == module_name):
            continue
        foreign = [base for base in cls.__mro__[1:] if not base.__module__.startswith(PACKAGE)]
        found |= {f"{cls.__name__}({base.__name__})": base for base in cls.__bases__
                  if base in foreign and is_private(base.__name__)}  # fmt: skip
        for name in vars(cls):
            owner = next((base for base in foreign if name in vars(base)), None)
            if is_private(name) and name != "_abc_impl" and owner is not None:
                found[f"{cls.__name__}.{name}"] = vars(owner)[name]
    return found


def resolve(module: str, qualname: str):
    """The object `module.qualname` names, or None."""
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def listed_overrides() -> dict[str, dict[str, internals.Overridden]]:
    """internals.OVERRIDDEN by engine file, each entry under the name foreign_private_overrides gives it."""
    listed = {}
    for entry in internals.OVERRIDDEN:
        module, cls = entry.by.rsplit(".", 1)
        name = entry.qualname.rsplit(".", 1)[-1]
        label = f"{cls}({name})" if inspect.isclass(resolve(entry.module, entry.qualname)) else f"{cls}.{name}"
        listed.setdefault(module.replace(".", "/") + ".py", {})[label] = entry
    return listed


def module_name(path: Path) -> str:
    return ".".join((PACKAGE, *path.relative_to(ENGINE.parent).with_suffix("").parts)).removesuffix(".__init__")


def test_another_librarys_private_names_are_used_in_engine_internals_alone():
    """Outside internals.py, a private name of another library is only a private class internals.py re-exports for a
    subclass listed in internals.OVERRIDDEN (that module's import of it)."""
    files = [path for path in engine_files() if path != ENGINE / "internals.py"]
    trees = {path: ast.parse(path.read_text()) for path in files}
    own = names_the_engine_defines(list(trees.values()))
    listed = listed_overrides()
    used = {}
    for path in files:
        file = str(path.relative_to(ENGINE))
        subclassed = {f"internals.{entry.qualname}" for label, entry in listed.get(file, {}).items() if "(" in label}
        used[file] = foreign_private_names(trees[path], own) - subclassed
    assert not any(used.values()), "private names of other libraries belong in engine/internals.py: " + "; ".join(
        f"{file}: {', '.join(sorted(names))}" for file, names in used.items() if names
    )


def test_overrides_of_another_librarys_private_names_are_listed_in_engine_internals():
    """Each override of a private method and each subclass of a private class is an entry of internals.OVERRIDDEN,
    naming the library's method or class it overrides; an entry no longer used fails too."""
    listed = listed_overrides()
    for path in engine_files():
        file = str(path.relative_to(ENGINE))
        found, entries = foreign_private_overrides(module_name(path)), listed.get(file, {})
        assert not found.keys() - entries.keys(), (
            f"{file}: list in internals.OVERRIDDEN: {sorted(found.keys() - entries.keys())}"
        )
        assert not entries.keys() - found.keys(), (
            f"{file}: no longer used, remove from internals.OVERRIDDEN: {sorted(entries.keys() - found.keys())}"
        )
        for label, entry in entries.items():
            assert found[label] is resolve(entry.module, entry.qualname), (
                f"{file}: {label} is not {entry.module}.{entry.qualname}"
            )


def test_the_guard_sees_a_private_import_an_attribute_and_an_override():
    code = (
        "from lightning.pytorch.loops.fit_loop import _FitLoop\n"
        "def steps(trainer):\n"
        "    return trainer.fit_loop.epoch_loop._batches_that_stepped\n"
    )
    assert foreign_private_names(ast.parse(code), own=set()) == {
        "lightning.pytorch.loops.fit_loop._FitLoop",
        "._batches_that_stepped",
    }
    assert foreign_private_names(ast.parse('getattr(optimizer, "_step_supports_amp_scaling", False)'), set()) == {
        "._step_supports_amp_scaling"
    }
    assert foreign_private_names(ast.parse("os._exit(1)\nself._mine = 1\n"), own={"_mine"}) == set()
    assert foreign_private_names(ast.parse("from ..internals import _FitLoop, set_restarting"), set()) == {
        "internals._FitLoop"
    }
    progress, safe_dcp = (f"{PACKAGE}.engine.{room}" for room in ("report.progress", "resume.safe_dcp"))
    assert foreign_private_overrides(progress).keys() >= {"TimedProgressBar._should_update"}
    assert "SafePlanner(_EmptyStateDictLoadPlanner)" in foreign_private_overrides(safe_dcp)


def installed(module: str) -> bool:
    """Whether the library of `module` is installed (optuna and datasets come with extras)."""
    return importlib.util.find_spec(module.split(".")[0]) is not None


def source_of(cls: type) -> str:
    """A class's source; empty for one without (a built-in, or one of a frozen module such as collections.abc, which
    a Hugging Face IterableDataset has among its bases once torch is imported)."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def test_every_private_name_in_internals_is_pinned_to_the_installed_libraries():
    """Each private name internals.py uses exists in the installed libraries with the signature it is called with:
    an upgrade that renames or changes one fails here, by name, not somewhere in a run."""
    for pinned in filter(lambda pinned: installed(pinned.module), internals.PINNED):
        owner = resolve(pinned.module, pinned.qualname)
        assert owner is not None, f"{pinned.module}.{pinned.qualname} is gone: {pinned.why}"
        if pinned.attribute is not None:
            sources = [source_of(cls) for cls in owner.__mro__]
            assert hasattr(owner, pinned.attribute) or any(f"self.{pinned.attribute}" in src for src in sources), (
                f"{pinned.module}.{pinned.qualname} no longer has {pinned.attribute}: {pinned.why}"
            )
        if pinned.parameters is not None:
            assert tuple(inspect.signature(owner).parameters) == pinned.parameters, f"{pinned.module}.{pinned.qualname}"


def test_every_override_listed_in_internals_is_pinned_to_the_installed_libraries():
    """Each private method or class the engine overrides exists in the installed libraries, and the method (the
    class's constructor) takes exactly the listed parameters, as the engine's override does."""
    for entry in filter(lambda entry: installed(entry.module), internals.OVERRIDDEN):
        overridden = resolve(entry.module, entry.qualname)
        assert overridden is not None, f"{entry.module}.{entry.qualname} is gone: {entry.why}"
        if entry.parameters is not None:
            module, cls = entry.by.rsplit(".", 1)
            engine_class = resolve(f"{PACKAGE}.engine.{module}", cls)
            override = engine_class if inspect.isclass(overridden) else getattr(engine_class, overridden.__name__)
            for what, callable_ in ((f"{entry.module}.{entry.qualname}", overridden), (entry.by, override)):
                assert tuple(inspect.signature(callable_).parameters) == entry.parameters, f"{what}: {entry.why}"


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """Every comment, docstring and `help=` text of a module, with its line."""
    source = path.read_text()
    found = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type == tokenize.COMMENT]  # fmt: skip
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if (docstring := ast.get_docstring(node, clean=False)) is not None:
                found.append((node.body[0].lineno, docstring))
        elif isinstance(node, ast.keyword) and node.arg == "help" and isinstance(node.value, ast.Constant):
            found.append((node.value.lineno, str(node.value.value)))
    return sorted(found)


def test_engine_docstrings_comments_and_help_carry_no_timings():
    timed = [f"{path.relative_to(ENGINE)}:{line}: {match.group(0)!r}" for path in engine_files()
             for line, text in comments_and_docstrings(path) for match in TIMING.finditer(text)]  # fmt: skip
    assert not timed, "figures belong in benchmarks/ and docs/, history in git: " + "; ".join(timed)


def test_the_timing_guard_sees_a_figure_in_a_comment_and_a_docstring(tmp_path: Path):
    module = tmp_path / "module.py"
    module.write_text('"""Fast: 5-10 s of imports saved."""\n\nx = 1  # ~0.6 ms a step, measured\n')
    texts = [text for _, text in comments_and_docstrings(module)]
    assert [match.group(0) for text in texts for match in TIMING.finditer(text)] == ["5-10 s", "0.6 ms", "measured"]

"""The engine stays simple enough to own: another library's private names go through engine/internals.py alone (its
overrides of private methods and subclasses of private classes are listed there), and the engine's docstrings, comments
and help texts say rules and reasons, not timings (figures live in benchmarks/)."""

import ast
import functools
import importlib
import importlib.util
import inspect
import io
import re
import textwrap
import tokenize
from pathlib import Path

import pytest

import template_package
from template_package.engine import internals

ENGINE = Path(template_package.__path__[0]) / "engine"
ALL_MODULES = 'it imports every engine module, the sweep\'s too: pip install -e ".[sweep]"'
PACKAGE = template_package.__name__
# Private-looking names that are documented public API: os._exit, and namedtuple's methods.
PUBLIC_WITH_UNDERSCORE = {"_exit", "_replace", "_asdict", "_fields", "_make"}
ACCESSORS = {"getattr", "hasattr", "setattr"}
# A timing, a measured ratio ("~8x faster", "3 times slower") or a percentage ("35% of an A100"); a rule's factor in
# words ("twice as long") is not a measurement.
TIMING = re.compile(
    r"\bmeasured\b|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:ms|us|µs|s|sec|min|seconds?|minutes?|hours?)\b"
    r"|~?\b\d+(?:\.\d+)?\s?[x×](?!\w)"
    r"|~?\b\d+(?:\.\d+)?\s?times\s(?:faster|slower|more|less|fewer|larger|smaller|longer|shorter|as)\b"
    r"|~?\b\d+(?:\.\d+)?\s?(?:%|percent\b)"
)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_WITH_UNDERSCORE


def is_self(node: ast.AST) -> bool:
    """`self`, `cls` or `super()`: the object of the class whose method this is."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        return True
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def engine_files() -> list[Path]:
    return sorted(path for path in ENGINE.rglob("*.py") if "__pycache__" not in path.parts)


def nodes_with_class(node: ast.AST, cls: str | None = None, prefix: str = ""):
    """Every node under `node`, each with the qualified name of the class whose body or method holds it (None outside
    any class): inside that class's methods, `self` is that class's object."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            yield child, cls
            yield from nodes_with_class(child, f"{prefix}{child.name}", f"{prefix}{child.name}.")
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield child, cls
            yield from nodes_with_class(child, cls, f"{prefix}{child.name}.<locals>.")
        else:
            yield child, cls
            yield from nodes_with_class(child, cls, prefix)


def private_names_in_source(cls: type) -> set[str]:
    """The private attributes a class's own source reads or writes on `self` or `cls`."""
    source = textwrap.dedent(source_of(cls))
    try:
        tree = ast.parse(source)
    except SyntaxError:  # (a class whose source inspect cut short)
        return set()
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and is_self(node.value) and is_private(node.attr)}  # fmt: skip


@functools.cache
def private_names_of_foreign_class(cls: type) -> frozenset[str]:
    """The private names another library's class defines: those in its namespace (methods, class attributes, slots)
    and those its source reads or writes on `self` (instance attributes)."""
    return frozenset({name for name in vars(cls) if is_private(name)} | private_names_in_source(cls))


def inherited_private_names(cls: type) -> set[str]:
    """The private names that the classes of other libraries among `cls`'s bases define: the engine's class writing
    or reading one through `self` uses that library's private name."""
    foreign = [base for base in cls.__mro__[1:] if not base.__module__.startswith(PACKAGE)]
    return set().union(*map(private_names_of_foreign_class, foreign))


def engine_classes(module_name: str) -> dict[str, type]:
    """The classes a module of the engine defines, by qualified name (nested classes too)."""
    found, todo = {}, list(vars(importlib.import_module(module_name)).values())
    while todo:
        cls = todo.pop()
        if inspect.isclass(cls) and cls.__module__ == module_name and cls.__qualname__ not in found:
            found[cls.__qualname__] = cls
            todo.extend(vars(cls).values())
    return found


def names_the_engine_defines(tree: ast.AST, inherited: dict[str, set[str]] | None = None) -> set[str]:
    """Private names of the engine's own in a module: its functions, classes, module names and attributes set on
    self/cls, except those that a class's bases of other libraries define (`inherited`, by the class's qualified
    name): an override of a library's private method, or a write to its private attribute through `self`, is the
    library's name, not the engine's."""
    inherited, defined = inherited or {}, set()
    for node, cls in nodes_with_class(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            name = node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_self(node.value):
            name = node.attr if cls is not None else None
        else:
            continue
        if name is not None and name not in inherited.get(cls, ()):
            defined.add(name)
    return {name for name in defined if is_private(name)}


def foreign_private_names(
    tree: ast.AST,
    own: set[str],
    inherited: dict[str, set[str]] | None = None,
    overridden: dict[str, set[str]] | None = None,
) -> set[str]:
    """Another library's private names a module uses: imported (from internals.py too, a private class it re-exports),
    read or written as attributes, or named to getattr/hasattr/setattr. Through `self`, a name that a class's bases of
    other libraries define (`inherited`, by the class's qualified name) is the library's, unless it is a method the
    class overrides as internals.OVERRIDDEN lists (`overridden`, by the class's qualified name)."""
    inherited, overridden = inherited or {}, overridden or {}

    def foreign(name: str, owner: ast.AST, cls: str | None) -> bool:
        if is_self(owner) and cls is not None and name in inherited.get(cls, ()):
            return name not in overridden.get(cls, ())
        return name not in own

    found = set()
    for node, cls in nodes_with_class(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if any(map(is_private, node.module.split("."))):
                found.add(f"from {node.module}")
            found |= {f"{node.module}.{alias.name}" for alias in node.names if is_private(alias.name)}
        elif isinstance(node, ast.ImportFrom) and node.module == "internals":
            found |= {f"internals.{alias.name}" for alias in node.names if is_private(alias.name)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if any(map(is_private, alias.name.split(".")))}
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and foreign(node.attr, node.value, cls):
            found.add(f".{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS:
            owner, name = (node.args + [None, None])[:2]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value):
                found |= {f".{name.value}"} if foreign(name.value, owner, cls) else set()
    return found


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


def foreign_private_names_by_file() -> dict[str, set[str]]:
    """The private names of other libraries each engine module but internals.py uses, by file under engine/."""
    files = [path for path in engine_files() if path != ENGINE / "internals.py"]
    trees = {path: ast.parse(path.read_text()) for path in files}
    classes = {path: engine_classes(module_name(path)) for path in files}
    inherited = {path: {name: inherited_private_names(cls) for name, cls in classes[path].items()} for path in files}
    own = set().union(*(names_the_engine_defines(trees[path], inherited[path]) for path in files))
    listed = listed_overrides()
    used = {}
    for path in files:
        file = str(path.relative_to(ENGINE))
        subclassed = {f"internals.{entry.qualname}" for label, entry in listed.get(file, {}).items() if "(" in label}
        overridden: dict[str, set[str]] = {}
        for label in listed.get(file, {}):
            if "(" not in label:
                cls, method = label.rsplit(".", 1)
                overridden.setdefault(cls, set()).add(method)
        used[file] = foreign_private_names(trees[path], own, inherited[path], overridden) - subclassed
    return {file: names for file, names in used.items() if names}


def test_another_librarys_private_names_are_used_in_engine_internals_alone():
    """Outside internals.py, a private name of another library is only a private class internals.py re-exports for a
    subclass listed in internals.OVERRIDDEN (that module's import of it), or, through `self`, a private method the
    class overrides as internals.OVERRIDDEN lists. A private attribute that a base class of another library defines
    is that library's, even when the engine's subclass writes it through `self`."""
    pytest.importorskip("optuna", reason=ALL_MODULES)
    used = foreign_private_names_by_file()
    assert not used, "private names of other libraries belong in engine/internals.py: " + "; ".join(
        f"{file}: {', '.join(sorted(names))}" for file, names in used.items()
    )


def test_overrides_of_another_librarys_private_names_are_listed_in_engine_internals():
    """Each override of a private method and each subclass of a private class is an entry of internals.OVERRIDDEN,
    naming the library's method or class it overrides; an entry no longer used fails too."""
    pytest.importorskip("optuna", reason=ALL_MODULES)
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


def test_the_guard_sees_a_base_classs_private_attribute_written_through_self():
    """A subclass of another library's class that writes or reads an attribute the library's class defines (in its
    source, as `self._x`, or in its namespace) uses the library's private name, though `self` is the engine's
    object; an attribute of the subclass's own stays the engine's, and so does a listed override's super() call."""
    from lightning.pytorch.callbacks import TQDMProgressBar
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger
    from lightning.pytorch.strategies import ModelParallelStrategy

    code = (
        "class Logger(CSVLogger):\n"
        "    def __init__(self):\n"
        "        super().__init__('.')\n"
        "        self._writer = None\n"
        "        self._experiment = None\n"
        "    def folder(self):\n"
        "        return self._writer, self._fs, getattr(self, '_version')\n"
        "def writer(logger):\n"
        "    return logger._writer, logger._experiment\n"
    )
    tree = ast.parse(code)
    inherited = {"Logger": inherited_private_names(type("Logger", (CSVLogger,), {}))}
    own = names_the_engine_defines(tree, inherited)
    assert own == {"_writer"}
    assert foreign_private_names(tree, own, inherited) == {"._experiment", "._fs", "._version"}
    assert names_the_engine_defines(tree) == {"_writer", "_experiment"}  # the old rule: every self._x was the engine's

    override = (
        "class Bar(TQDMProgressBar):\n"
        "    def _should_update(self, current, total):\n"
        "        return super()._should_update(current, total) and self._train_progress_bar is not None\n"
    )
    tree, inherited = ast.parse(override), {"Bar": inherited_private_names(type("Bar", (TQDMProgressBar,), {}))}
    assert names_the_engine_defines(tree, inherited) == set()
    assert foreign_private_names(tree, set(), inherited, overridden={"Bar": {"_should_update"}}) == {
        "._train_progress_bar"
    }
    assert foreign_private_names(tree, set(), inherited) == {"._should_update", "._train_progress_bar"}
    # Instance attributes found in the library's source only, through its base classes too.
    assert inherited_private_names(type("S", (ModelParallelStrategy,), {})) >= {"_data_parallel_size", "_launcher"}
    assert "_run_id" in inherited_private_names(type("M", (MLFlowLogger,), {}))


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


def test_the_timing_guard_sees_a_ratio_and_a_percentage_but_not_a_rules_factor(tmp_path: Path):
    module = tmp_path / "module.py"
    module.write_text(
        '"""Trains at about 35% of an A100; a stale trial is silent for twice as long."""\n\n'
        "x = 1  # TF32: ~8x faster on Ampere+; seeding every accelerator is 100 times slower; 2.5× the memory\n"
        "y = 0x7F  # a 3x3 convolution, 50 percent of the batch, every 2 steps\n"
    )
    texts = [text for _, text in comments_and_docstrings(module)]
    found = [match.group(0) for text in texts for match in TIMING.finditer(text)]
    assert found == ["35%", "~8x", "100 times slower", "2.5×", "50 percent"]

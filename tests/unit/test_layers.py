"""The harness's import structure, read from its sources (ast): every module sits in a layer and imports no upper
one; no module imports itself back through others; the benchmarks share code through benchmarks/common.py only.

Imports inside functions count as much as those at a module's top: a function-level import is how the cycle
measure/environment.py -> fingerprint.py -> gpu_state.py -> environment.py hid (each import deferred, so that no
import failed, while no module could be read without the other two). A package's own __init__ is counted only
where a module names it (`from harness.kernels import ATTENTION`), not for every submodule Python loads under it.
Targets a registry loads by name ("harness.modes.graphed:GraphedMode") are strings, not imports: not counted."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Each layer and the layers it may import, bottom to top. `base` imports nothing of the harness.
LAYERS = {
    "base": {"base"},
    "kernels": {"kernels", "base"},
    "modes": {"modes", "kernels", "base"},
    "config": {"config", "modes", "kernels", "base"},
    "models": {"models", "config", "modes", "kernels", "base"},
    "measure": {"measure", "models", "config", "modes", "kernels", "base"},
    "store": {"store", "config", "base"},
    "analysis": {"analysis", "store", "measure", "config", "modes", "base"},
    "cli": {"cli", "analysis", "store", "measure", "models", "config", "modes", "kernels", "base"},
    "entry": {"entry", "cli", "base"},
}
# The modules outside a subpackage, each in its layer; a subpackage's modules are in the layer of its name
TOP_LEVEL = {"harness": "base", "harness.cache": "base", "harness.errors": "base", "harness.clock": "base",
             "harness.progress": "base", "harness.record": "base", "harness.registry": "base", "harness.models": "models",
             "harness.__main__": "entry"}


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module under `root`/`package`, by dotted name (a package by its own name, not `__init__`)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(path: Path) -> list[str]:
    """The dotted names a module's imports name, at its top and inside its functions: for `from a.b import c`,
    both `a.b` and `a.b.c` (c may be a module or a name in a.b)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def import_graph(known: dict[str, Path], resolve=None) -> dict[str, set[str]]:
    """module -> the modules of `known` it imports, each name resolved to its longest known prefix."""
    def longest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    resolve = resolve or longest
    return {module: {target for name in imported_names(path) if (target := resolve(name)) and target != module}
            for module, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle's modules (the strongly connected components of more than one module), by Tarjan's algorithm."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                component.append(stack.pop())
                on_stack.discard(component[-1])
                if component[-1] == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


SUBPACKAGES = {path.parent.name for path in (REPO / "harness").glob("*/__init__.py")}


def layer_of(module: str) -> str | None:
    """A subpackage's modules are in the layer of its name; the others where TOP_LEVEL puts them."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1] if parts[1] in LAYERS else None
    return TOP_LEVEL.get(module)


def test_every_harness_module_is_in_a_layer():
    """A module added at the top of harness/ (as errors.py was) must be placed in the table, not left unchecked."""
    assert [m for m in modules(REPO, "harness") if layer_of(m) is None] == []


def test_lower_layers_import_no_upper_one():
    """measure/, modes/, kernels/ and config/ know nothing of the store, the analysis or the command line; kernels
    import no config (ConfigError is harness/errors.py's, below both); the modules at harness/'s top are checked
    as much as the subpackages."""
    graph = import_graph(modules(REPO, "harness"))
    wrong = [f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
             for module, targets in sorted(graph.items()) for target in sorted(targets)
             if layer_of(target) not in LAYERS[layer_of(module)]]
    assert wrong == []


def test_the_layer_check_sees_a_function_level_import_and_a_top_level_module():
    """The check itself: a kernel importing the config inside a function, as attention.py once imported ConfigError
    (config and kernels then imported each other), and a base module importing a layer above it, are found."""
    layers_of = {m: layer_of(m) for m in ("harness.kernels.attention", "harness.config.schema", "harness.record",
                                          "harness.models", "harness.__main__", "harness")}
    assert layers_of == {"harness.kernels.attention": "kernels", "harness.config.schema": "config",
                         "harness.record": "base", "harness.models": "models", "harness.__main__": "entry",
                         "harness": "base"}
    assert "config" not in LAYERS["kernels"] and "models" not in LAYERS["base"]


def test_config_error_comes_from_harness_errors_only():
    """One home for the error every layer raises: no module imports it from the config (a re-export would let the
    kernels' import of the config back in)."""
    found = [f"{path.relative_to(REPO)}: from {name.rpartition('.')[0]}"
             for directory in ("harness", "tests", "benchmarks", "hydra_plugins")
             for path in sorted((REPO / directory).rglob("*.py"))
             for name in imported_names(path) if name.endswith(".ConfigError") and name != "harness.errors.ConfigError"]
    assert found == []


def test_no_harness_module_imports_itself_back_through_others():
    assert cycles(import_graph(modules(REPO, "harness"))) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The check itself, on a package whose circle closes inside a function (as environment -> fingerprint ->
    gpu_state -> environment did): found; the same package as a chain: none."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.b import g\n    return g()\n")
    (package / "b.py").write_text("from pkg import c\n\ndef g():\n    return c.h()\n")
    (package / "c.py").write_text("import os\n\ndef h():\n    import pkg.a\n    return pkg.a\n")
    assert cycles(import_graph(modules(tmp_path, "pkg"))) == [["pkg.a", "pkg.b", "pkg.c"]]
    (package / "c.py").write_text("import os\n\ndef h():\n    return os\n")
    assert cycles(import_graph(modules(tmp_path, "pkg"))) == []


def test_the_benchmarks_share_code_through_common_only():
    """A benchmark is a script: it imports its folder's modules by bare name (`from common import ...`). One
    benchmark importing another (as fused_kernels.py and a sibling once imported each other) ties two scripts
    together, and one importing the tests (three took their config from tests/support.py) needs the test suite and
    pytest to run; what they share goes in common.py."""
    scripts = {path.stem: path for path in (REPO / "benchmarks").glob("*.py")}

    def sibling(name: str) -> str | None:
        head = name.removeprefix("benchmarks.").split(".")[0]
        return head if head in scripts and name.split(".")[0] in (head, "benchmarks") else None

    graph = import_graph(scripts, resolve=sibling)
    assert "common" in scripts and graph["common"] == set()
    assert {f"{script} imports {target}" for script, targets in graph.items() for target in targets
            if target != "common"} == set()
    assert [f"{script} imports {name}" for script, path in sorted(scripts.items()) for name in imported_names(path)
            if name.split(".")[0] == "tests"] == []

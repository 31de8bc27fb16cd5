"""The README's commands are the ones CI runs."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_command = next(line for line in readme.splitlines() if line.endswith("python -m pytest"))
    assert test_command in ci.splitlines()


def test_modules_and_functions_stay_short():
    """One screen per function, one job per module: no module over 250 lines, no function over 40."""
    import ast

    long = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        source = path.read_text()
        if len(source.splitlines()) > 250:
            long.append(f"{path.name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 40:
                long.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []

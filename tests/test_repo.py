"""The README's commands are the ones CI runs."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_command = next(line for line in readme.splitlines() if line.endswith("python -m pytest"))
    assert test_command in ci.splitlines()

"""The repository's own rules: the README's commands are the ones CI runs; functions stay short; no work-item
numbers in code, tests, configs or docs (the layers and import cycles: tests/unit/test_layers.py)."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]


SOURCES = ("harness", "tests", "hydra_plugins", "benchmarks", "conf")


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_command = next(line for line in readme.splitlines() if "&& python -m pytest" in line)
    assert test_command in ci.splitlines()


def test_functions_stay_short():
    """One screen per function (a module is as long as its decode path needs, read top to bottom)."""
    long = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 40:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []


WORK_ITEM = re.compile(r"\bissues? ?#?\d+|\bwork item|\btest_items?\d", re.IGNORECASE)


def test_no_work_item_numbers_in_code_tests_configs_or_docs():
    """Names and docs say what a thing does or answers, not which ticket asked for it."""
    files = [p for d in SOURCES for p in (REPO / d).rglob("*") if p.suffix in (".py", ".yaml", ".sh", ".md")]
    files += [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:80]}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1) if WORK_ITEM.search(line)]
    assert found == []


# A GPU's serial, a calendar date, a pairing phrase, or a GPU named beside a measured figure: the marks of a lab
# notebook. Code says what it does and why, in words that stay true; each measurement goes to the docs page for its
# question (docs/fused-knobs.md for the fused kernels' knobs).
LAB_NOTE = re.compile(r"GPU-[0-9a-f]{8}|\b20\d\d-[01]\d-[0-3]\d\b|\bpaired on\b|\b(one|an|two|three|four) H[12]00s?\b"
                      r"|\bH[12]00s?\b.*\d(\.\d+)? ?(ms|µs|us|%|TB/s|GB/s)\b|\d(\.\d+)? ?(ms|µs|%|TB/s|GB/s)\b.*\bH[12]00s?\b"
                      r"|\d(\.\d+)?% (faster|slower|off|less|more|longer)\b", re.IGNORECASE)


def lab_notes(text: str) -> list[str]:
    return [f"{n}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), 1) if LAB_NOTE.search(line)]


def test_code_carries_no_gpu_serial_date_or_figure_measured_on_one_machine():
    found = [f"{path.relative_to(REPO)}:{note}" for path in sorted((REPO / "harness").rglob("*.py"))
             for note in lab_notes(path.read_text())]
    assert found == []


def test_the_lab_note_check_catches_each_mark():
    """Each kind of mark the check above is for, as it stood in the code, is found; a rule in words is not."""
    assert all(lab_notes(line) for line in (
        "# paired on one H200 (GPU-16875c31, 2026-12-06)", "# Qwen3-8B's step 7.8% faster, on an H200",
        "# asked at the wait, 12-40 MiB added 6.7-9.0% to its step (one H100)", "# measured on 2026-12-05",
        "# (GPU-ede9b7a7)", "# paired on two H100s", "# 3.4 TB/s on the H200", "# took 2.1% off its step"))
    assert lab_notes("# the next tile is loaded before this one is used, so that HBM stays busy (64 x 128 tiles)") == []
    assert lab_notes('    gpu_id = "GPU-" + str(uuid)') == []


def test_every_source_path_a_config_file_names_exists():
    """conf/config.yaml pointed to harness/config.py, which became harness/config/schema.py."""
    import re

    named = {(path.relative_to(REPO), ref) for path in (REPO / "conf").glob("**/*.yaml")
             for ref in re.findall(r"\b((?:harness|docs|benchmarks|tests)/[\w./-]+\.(?:py|md))\b", path.read_text())}
    assert named and [(str(path), ref) for path, ref in named if not (REPO / ref).is_file()] == []


def test_git_ignores_no_tracked_file():
    """.gitignore listed conf/config.yaml, which git tracks: an edit of it would be easy to lose."""
    done = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()[:100]}")
    assert done.stdout.split() == []

"""Every harness/….py and conf/… path that a docstring, comment or page names exists: a reader sent to a file that
was moved finds nothing there. Bugs caught, each a pointer left behind by a move:
- conf/config.yaml named harness/config.py, which became harness/config/schema.py;
- cli/runner.py named harness/app.py, which became harness/cli/app.py;
- modes/base.py named harness/verify.py, which became harness/measure/verify.py;
- measure/job.py named harness/roofline.py, which became harness/measure/roofline.py;
- kernels/attention.py named harness/triton_decode.py, which became harness/kernels/triton_decode.py."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"(?<![\w./:-])(harness/[\w/]*\w\.py|conf/[\w/.-]*\w)")
# A path said to have moved ("X, which became Y", Y a path that exists) is history, not a pointer
MOVED = r",? which became (harness/[\w/]*\w\.py|conf/[\w/.-]*\w)"
# The files docs/extending.md shows a reader how to write: examples, not pointers
EXAMPLES = {"conf/model/qwen3-mini.yaml", "harness/kernels/mine.py"}
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b")  # conf/experiment/NAME.yaml: a pattern, which some file must match


def scanned() -> list[Path]:
    """The code, tests, configs and docs (not the changelog, which records what was)."""
    files = [path for folder in ("harness", "benchmarks", "conf", "tests", "hydra_plugins")
             for path in sorted((REPO / folder).rglob("*")) if path.suffix in (".py", ".yaml", ".md", ".sh")]
    return files + [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def exists(path: str) -> bool:
    pattern = PLACEHOLDER.sub("*", path)
    return path in EXAMPLES or (any(REPO.glob(pattern)) if pattern != path else (REPO / path).exists())


def missing_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) for each path the text names that does not exist and is not said to have moved."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in NAMED.finditer(line):
            path = match.group(1)
            moved = re.match(MOVED, line[match.end():])
            if not exists(path) and not (moved and exists(moved.group(1))):
                found.append((number, path))
    return found


def test_every_source_path_named_in_code_tests_configs_and_docs_exists():
    stale = [f"{file.relative_to(REPO)}:{line}: {path}" for file in scanned()
             for line, path in missing_paths(file.read_text())]
    assert stale == []


def test_the_check_finds_a_moved_file_and_passes_what_was_said_to_move():
    """The check itself: each of the stale paths the issue found, as it stood, is found; the same path said to have
    moved to a file that exists is not, nor is one said to have moved to a file that does not exist either."""
    gone = ["harness/" + name for name in ("config.py", "app.py", "verify.py", "roofline.py")]
    assert missing_paths("\n".join(f"# see {path} (the schema)" for path in gone)) == [(1, gone[0]), (2, gone[1]),
                                                                                      (3, gone[2]), (4, gone[3])]
    assert missing_paths(f'"""{gone[0]}, which became harness/config/schema.py."""') == []
    assert missing_paths(f"# {gone[0]}, which became harness/config/" + "nowhere.py") == [
        (1, gone[0]), (1, "harness/config/" + "nowhere.py")]
    assert missing_paths("# conf/experiment/NAME.yaml and conf/model/ and harness/measure/job.py") == []
    assert missing_paths("# conf/" + "nothing/NAME.yaml") == [(1, "conf/" + "nothing/NAME.yaml")]

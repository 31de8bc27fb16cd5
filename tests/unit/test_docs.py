"""The docs as a product: a README read in minutes, one short page per question with today's figures only, every
table and chart regenerated from a committed result set, and those sets small enough for every clone to carry."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from harness.analysis import report
from harness.analysis.headline import headline_markdown
from harness.analysis.report import latest_of_each_config
from harness.analysis.rows import row_of


REPO = Path(__file__).resolve().parents[2]


RESULTS = REPO / "docs" / "results"


PAGES = sorted((REPO / "docs").glob("*.md"))


MARKER = re.compile(r"<!-- results: python -m harness report (\S+) --headline -->\n(.*?)\n<!-- /results -->", re.S)


IMAGE = re.compile(r"!\[[^\]]*\]\(((?:docs/)?img/([\w.-]+?)-(ladder|context)\.png)\)")


DATED = re.compile(r"\b(19|20)\d\d\b")  # a year in a heading: a journal's entry, not a page's question


def _text(path: Path) -> str:
    return path.read_text()


def _rows(folder: Path) -> list[dict]:
    return [row_of(r) for r in latest_of_each_config(folder)[1]]


def test_the_readme_is_short_and_opens_with_a_table_that_harness_report_prints():
    readme = _text(REPO / "README.md")
    assert len(readme.splitlines()) <= 160
    markers = list(MARKER.finditer(readme))
    assert len(markers) == 1 and readme[:markers[0].start()].count("\n") < 20  # one table, on the first screen


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_docs_page_is_short_and_has_no_dated_heading(page):
    lines = _text(page).splitlines()
    assert len(lines) <= 400
    in_code = False
    for line in lines:
        in_code ^= line.startswith("```")
        assert in_code or not (line.startswith("#") and DATED.search(line)), line


def test_every_table_in_the_readme_and_the_pages_is_harness_report_of_its_committed_set():
    found = 0
    for path in [REPO / "README.md", *PAGES]:
        for marker in MARKER.finditer(_text(path)):
            records = latest_of_each_config(REPO / marker.group(1))[1]
            assert marker.group(2) == headline_markdown(records), f"{path.name}: {marker.group(1)}"
            assert re.match(r"GPU NVIDIA H(200|100 80GB HBM3);", marker.group(2)) and len(records) >= 4
            found += 1
    assert found >= 5


def test_the_results_folder_holds_only_the_sets_the_docs_read_each_with_its_provenance():
    """Each set a page or the README regenerates a table or a chart from, and nothing else: its jobs' result.json
    (what `harness report` reads) and a README naming its command, machine and date."""
    docs = "".join(_text(p) for p in [REPO / "README.md", *PAGES])
    named = {Path(m.group(1)).name for m in MARKER.finditer(docs)} | {m.group(2) for m in IMAGE.finditer(docs)}
    sets = {p.name for p in RESULTS.iterdir() if p.is_dir()}
    assert sets == named
    for name in sets:
        files = [p for p in (RESULTS / name).rglob("*") if p.is_file()]
        assert {p.name for p in files} == {"result.json", "README.md"}, name
        about = _text(RESULTS / name / "README.md")
        assert "command: `python -m harness" in about and "machine: " in about and re.search(r"date: 20\d\d-", about)


def test_the_results_folder_stays_under_5_mb():
    """As `du` counts it: every file and folder in whole blocks of 4 KiB."""
    paths = list(RESULTS.rglob("*"))
    blocks = sum(-(-p.stat().st_size // 4096) if p.is_file() else 1 for p in paths)
    assert blocks * 4096 < 5 * 1024 * 1024, f"{blocks * 4096 / 1024 / 1024:.1f} MiB"


@pytest.mark.parametrize("image", sorted({m.group(1) for p in [REPO / "README.md", *PAGES]
                                          for m in IMAGE.finditer(_text(p))}))
@pytest.mark.slow
def test_every_chart_shown_is_harness_reports_chart_of_its_set(image, tmp_path):
    """The committed PNG exists, and `harness report SET --out DIR` draws that chart again at the same size."""
    path = REPO / (image if image.startswith("docs/") else f"docs/{image}")
    name, chart = IMAGE.match(f"![]({image})").group(2, 3)
    made = report.plots(_rows(RESULTS / name), tmp_path)
    assert tmp_path / f"{chart}.png" in made
    assert plt.imread(path).shape == plt.imread(tmp_path / f"{chart}.png").shape

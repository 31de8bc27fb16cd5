"""The MLflow UI in a real headless Chromium (Debian's), driven by Playwright, on a store filled by a
real tiny sweep: the sweep's run names and a latency metric must be on the page."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from harness.cli import commands as cli
from tests.support import runs_by_kind


# the served sweep (conftest) is paid once a worker: its tests in one worker under pytest-xdist (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("served")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]


def _shows(page, value: float, timeout_s: float = 60) -> bool:
    """The page shows the value, as the UI rounds it (the table fills in after the page's first render)."""
    forms = {f"{value:.3f}"[:4], f"{value:.2f}", f"{value:.4g}", f"{value:.5g}"}  # 117.988: 117., 117.99, 118
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(form in page.inner_text("body") for form in forms):  # the visible text, not the page's CSS
            return True
        time.sleep(0.5)
    return False


def _median_as_shown(child) -> re.Pattern:
    """A job's median as the parent's page shows it: to 3 decimals in the description's table, from the job's own
    record, and as MLflow prints the logged metric (4 significant figures) in the metrics table. From 10 ms up the
    two differ (11.124 against 11.12), as a loaded machine's tiny steps can."""
    record = json.loads((Path(child.data.tags["job_dir"]) / "result.json").read_text())
    forms = {f"{record['metrics']['step_ms_median']:.3f}", f"{child.data.metrics['step_ms_median']:.4g}"}
    return re.compile("^(" + "|".join(re.escape(form) for form in sorted(forms)) + ")$")


def _printed(stdout: str, prefix: str) -> str:
    return next(line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix))


def _screenshot(page, name: str) -> None:
    """With HARNESS_SCREENSHOT_DIR set, keep what the page shows (the README's screenshots come from here)."""
    if folder := os.environ.get("HARNESS_SCREENSHOT_DIR"):
        page.wait_for_timeout(1500)  # charts and the table's late columns
        page.screenshot(path=str(Path(folder) / name))


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium (apt-get install chromium)")
def test_the_sweep_shows_in_the_mlflow_ui(served_sweep):
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    assert served_sweep.sweep.returncode == 0, served_sweep.sweep.stderr
    server = served_sweep.url
    exp, (parent,), children = runs_by_kind(MlflowClient(server))
    child = next(c for c in children if c.data.params["bs"] == "1")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        # a common desktop screen: narrower, MLflow's run page puts "About this run" above the description while
        # its assistant panel is open (as it is for a new user)
        page = browser.new_page(viewport={"width": 1920, "height": 1080})
        # the link the sweep printed opens the runs table (the model-training view, not a GenAI overview), the
        # jobs fastest first with their medians and speedups as columns
        runs_url = _printed(served_sweep.sweep.stdout, "Every run, fastest first: ")
        page.goto(runs_url, wait_until="load")
        assert parent.info.run_name.startswith("bs=1,2 · model=tiny ")  # what it varied, then fixed
        assert "tracking" not in parent.info.run_name  # where it is stored is not what it measures
        page.get_by_text(parent.info.run_name, exact=True).first.wait_for(timeout=60_000)
        page.get_by_text("step_ms_median").first.wait_for(timeout=60_000)
        assert "/runs?" in page.url and "No data available" not in page.inner_text("body")  # not the GenAI overview
        fastest = min(children, key=lambda c: c.data.metrics["step_ms_median"]).info.run_name
        body = page.inner_text("body")
        assert body.index(fastest) < body.index(parent.info.run_name)  # jobs flat, fastest first; parent below
        # the median, then the sweep's varied key, then mode and dtype, on screen at 1920 wide without scrolling
        names = ("step_ms_median", "bs", "mode", "dtype")
        headers = {name: page.get_by_text(name, exact=True).first.bounding_box() for name in names}
        assert all(box and box["x"] + box["width"] <= 1920 for box in headers.values()), headers
        assert headers["step_ms_median"]["x"] == min(box["x"] for box in headers.values())  # (params: A-Z in MLflow)
        _screenshot(page, "mlflow_runs_table.png")
        # the link the sweep printed opens its parent's page, on its description (the results table), in the
        # model-training view: every median above the fold
        page.goto(_printed(served_sweep.sweep.stdout, "This sweep's results table: "), wait_until="load")
        assert "workflowType=machine_learning" in page.url
        page.get_by_text("runs passed verification").first.wait_for(timeout=60_000)  # the description is in
        page.wait_for_timeout(1000)  # and the page has settled around it
        for c in children:
            shown = page.get_by_text(_median_as_shown(c))
            shown.first.wait_for(timeout=60_000)
            boxes = [element.bounding_box() for element in shown.all()]  # the description's, the metrics table's
            assert any(b and b["y"] + b["height"] <= 1080 for b in boxes), boxes  # one needs no scrolling
        _screenshot(page, "mlflow_parent_run.png")
        page.goto(f"{server}/#/experiments/{exp.experiment_id}/runs/{child.info.run_id}", wait_until="load")
        page.get_by_text("bs=1 tiny ctx=8 cache=64 eager").first.wait_for(timeout=60_000)
        page.get_by_text("step_ms_median").first.wait_for(timeout=60_000)
        # the UI rounds; its leading digits agree, with no trailing zero (a logged 6.6 shows as 6.6, not 6.60)
        median = f"{child.data.metrics['step_ms_median']:.4g}"[:4]
        assert median in page.content()
        # the link the sweep printed opens MLflow's comparison of its runs, medians included
        url = _printed(served_sweep.sweep.stdout, "Compare this sweep's runs: ")
        assert url.startswith(f"{server}/#/compare-runs?runs=")
        page.goto(url, wait_until="load")
        page.get_by_text("step_ms_median").first.wait_for(timeout=60_000)
        for c in children:
            assert _shows(page, c.data.metrics["step_ms_median"]), c.data.metrics["step_ms_median"]
        # `harness compare` logs its files on the candidate's parent: the sweep against itself, all `same`
        assert cli.main(["compare", parent.info.run_id, parent.info.run_id, "--tracking-uri", served_sweep.uri,
                         "--out", str(served_sweep.root / "cmp")]) == 0
        page.goto(f"{server}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}/artifacts", wait_until="load")
        page.get_by_text("compare", exact=True).first.click(timeout=60_000)
        page.get_by_text("compare.md").first.wait_for(timeout=60_000)
        browser.close()

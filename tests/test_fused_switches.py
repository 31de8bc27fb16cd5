"""mode=fused's switches are declared once, in harness/config/fused.py's FusedConfig: a new field there reaches the
run's label, `--help` and the run's config (its params) with no other line changed."""
from __future__ import annotations

import shutil
import subprocess
import sys

from harness.config.fused import FUSED_SWITCHES, FusedConfig, switches_help
from harness.modes.fused import as_run
from tests.support import REPO

THROWAWAY = '    throwaway: bool = switch(False, "a test\'s switch, used nowhere")\n'


def test_a_new_switch_is_one_field_and_shows_in_labels_help_and_the_run_config(tmp_path):
    """A copy of the harness whose FusedConfig has one more field (the only line added): `--help` lists it, a run
    that sets it is named by it, and the job's config (which its MLflow params flatten) holds it."""
    for name in ("harness", "conf", "hydra_plugins"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    source = tmp_path / "harness" / "config" / "fused.py"
    text = source.read_text()
    anchor = "    tma: bool = switch("
    assert text.count(anchor) == 1
    source.write_text(text.replace(anchor, THROWAWAY + anchor))

    def harness(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", "import sys; from harness.cli.main import main; "
                               "sys.exit(main(sys.argv[1:]))", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert "fused.throwaway (default false): a test's switch, used nowhere" in harness("--help")
    job = harness("mode=fused", "model=tiny", "device=cpu", "fused.throwaway=true", "--cfg", "job")
    assert "throwaway: true" in job.split("fused:")[1]
    label = subprocess.run([sys.executable, "-c", "from harness.cli.precheck import compose_single_run; "
                            "print(compose_single_run(['mode=fused', 'model=tiny', 'fused.throwaway=true']).label)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert label.stdout.strip().endswith("fused throwaway=on"), label.stderr[-2000:]


def test_labels_and_help_read_every_switch_from_the_dataclass():
    assert FUSED_SWITCHES == {f"fused.{name}": value for name, value in vars(FusedConfig()).items()}
    assert [line.split(" (")[0].strip() for line in switches_help()] == list(FUSED_SWITCHES)


def test_a_switch_whose_hardware_the_device_lacks_runs_off():
    """On a CPU the Hopper-only techniques and the slices run off; on a GPU older than Hopper the slices stay on;
    a switch the user turned off stays off everywhere."""
    wanted = FusedConfig(prefetch=True, split_k=False)
    cpu, older, hopper = as_run(wanted, False, False), as_run(wanted, True, False), as_run(wanted, True, True)
    assert (cpu.pdl, cpu.prefetch, cpu.weights_ahead, cpu.tma, cpu.slices) == (False,) * 5
    assert (older.slices, older.pdl, older.tma) == (True, False, False)
    assert hopper == wanted and not hopper.split_k and cpu.packed and cpu.fold_attention

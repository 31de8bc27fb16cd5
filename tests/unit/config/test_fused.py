"""harness/config/fused.py: mode=fused's switches are declared once, in FusedConfig: a new field there reaches the
run's label, `--help` and the run's config (its params) with no other line changed; and what the config refuses for
mode=fused before anything is built."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from harness.config.fused import FUSED_SWITCHES, FusedConfig, switches_help
from harness.errors import ConfigError
from tests.support import FAST, REPO, run_config
from tests.unit.kernels.fused.support import FUSED


THROWAWAY = '    throwaway: bool = switch(False, "a test\'s switch, used nowhere")\n'


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_config_gives_fused_its_attention_and_refuses_what_it_cannot_run():
    cfg = run_config(*FUSED, "fused.pdl=false")
    assert cfg.attn == "triton-decode" and cfg.label.endswith("fused pdl=off")
    with pytest.raises(ConfigError, match=r"^model=qwen3-30b-a3b \(model_type=qwen3_moe\) is not covered by mode=fused"):
        run_config("mode=fused", "model=qwen3-30b-a3b")
    with pytest.raises(ConfigError, match="^attn=flex is invalid with mode=fused: .* use attn=triton-decode$"):
        run_config(*FUSED, "attn=flex")
    with pytest.raises(ConfigError, match="^fused.split_k applies to mode=fused only, not mode=eager$"):
        run_config(*FAST, "fused.split_k=false")
    with pytest.raises(ConfigError, match="^model.fuse_projections=true is invalid with mode=fused"):
        run_config(*FUSED, "model.fuse_projections=true")

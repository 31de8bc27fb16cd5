"""The command line's entry (harness/cli/main.py) in process: Hydra's own errors and bad sweeps are one line and
exit 2 with nothing created; the CPU set-up command ends with exit 0."""
from __future__ import annotations

import pytest

from tests.support import FAST


def refused(argv: list[str], where, capsys) -> str:
    """main()'s answer to a command line that must be refused: exit 2, one line on stderr, nothing printed on
    stdout, nothing created in `where` (the working folder: no store, no outputs). Returns the line."""
    from harness.cli.main import main

    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out.err
    assert list(where.iterdir()) == []
    return out.err.strip()


@pytest.mark.parametrize("argv, says", [
    (["-m", "+experiment=nosuch"], "harness: In 'config': Could not find 'experiment/nosuch' Available options in "
                                   "'experiment': capacity context cpu design-card"),
    (["-m", "experiment=ladder"], "To append to your default list use +experiment=ladder"),
    (["+experiment=nosuch"], "Could not find 'experiment/nosuch'"),
])
def test_hydras_own_errors_are_one_line_and_exit_2_with_nothing_created(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.chdir(tmp_path)
    assert says in refused(argv, tmp_path, capsys)


def test_a_sweep_holding_one_bad_batch_size_exits_2_before_any_job_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = refused(["-m", *FAST, "bs=1,0"], tmp_path, capsys)
    assert line == ("harness: bs=0 is invalid: the batch size must be >= 1 (in the sweep's job "
                    f"{' '.join(FAST)} bs=0; nothing ran)")


@pytest.mark.slow
def test_the_cpu_set_up_command_ends_with_exit_0_on_a_cpu(tmp_path, monkeypatch, torch_threads):
    from harness.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["-m", "+experiment=cpu"]) == 0


@pytest.mark.parametrize("argv", [
    [*FAST, "device=cpu", "hydra.run.dir={file}/run"],
    ["-m", *FAST, "device=cpu", "bs=1,2", "hydra.sweep.dir={file}/sweep/${{now:%H-%M-%S}}"],
])
def test_an_output_folder_under_a_file_is_one_line_exit_2_and_no_stray_parent_run(tmp_path, monkeypatch, capsys,
                                                                                  argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    from harness.cli.main import main

    assert main([a.format(file=tmp_path / "notes.txt") for a in argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out.err
    assert f"{tmp_path / 'notes.txt'} is a file, not a folder" in out.err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # no store (so no parent run), no folder

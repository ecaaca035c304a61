"""cli/export.py, `moetune export STUDY [--trial N] --format megatron|bridge|diff [--out FILE]`: the
export printed or written; a study or trial that does not exist or never completed is one line on
stderr and exit 2. In process, through cli/main.py (a study written into a store: tests/export_study.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moetune.cli.main import main
from moetune.report import export
from moetune.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import export_study  # noqa: E402

STUDY = export_study.STUDY


@pytest.fixture
def db(tmp_path):
    return export_study.build(tmp_path)[0]


def one_error_line(capsys, code: int, *fragments: str) -> str:
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and lines[0].startswith("moetune export: "), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("fmt", export.FORMATS)
def test_each_format_printed_is_the_best_trials_export(db, capsys, fmt):
    assert main(["--db", db, "export", STUDY, "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert out == export.render(export.choose(Store(db, read_only=True), STUDY), fmt)
    assert f"study {STUDY}, trial 3" in out


def test_megatron_is_the_default_format_and_trial_picks_another(db, capsys):
    assert main(["--db", db, "export", STUDY, "--trial", "2"]) == 0
    out = capsys.readouterr().out
    assert "trial 2 (a trial" in out and "pretrain_gpt.py \\" in out and "--micro-batch-size 4 \\" in out
    assert "--overlap-moe-expert-parallel-comm" not in out


def test_out_writes_the_file(db, capsys, tmp_path):
    target = tmp_path / "bridge.txt"
    assert main(["--db", db, "export", STUDY, "--format", "bridge", "--out", str(target)]) == 0
    assert capsys.readouterr().out == f"bridge: {target}\n"
    assert "train.micro_batch_size=4" in target.read_text().splitlines()


def test_what_cannot_be_exported_is_one_line(db, capsys, tmp_path):
    one_error_line(capsys, main(["--db", db, "export", "nope"]), "no study named 'nope'")
    one_error_line(capsys, main(["--db", db, "export", STUDY, "--trial", "9"]), "has no trial 9")
    one_error_line(capsys, main(["--db", db, "export", STUDY, "--trial", "5"]), "trial 5 never completed",
                   "state failed")
    one_error_line(capsys, main(["--db", db, "export", "../x"]), "study '../x'")
    one_error_line(capsys, main(["--db", db, "export", STUDY, "--out", str(tmp_path / "no" / "f")]),
                   "cannot be written")
    one_error_line(capsys, main(["--db", str(tmp_path / "none.db"), "export", STUDY]), "no moetune store")


@pytest.mark.parametrize("argv", [["--trial", "0"], ["--format", "yaml"]])
def test_usage_errors_exit_2(db, capsys, argv):
    assert main(["--db", db, "export", STUDY, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"moetune export: argument {argv[0]}")

"""analysis/usage.py: every moetune command's usage error is one line on stderr, exit 2, naming the
flag meant where a flag is mistyped, whether the command's own parser or moetune's top one sees it."""
import pytest

from moetune.cli.main import main


@pytest.mark.parametrize("argv, says", [
    (["plan", "qwen3_235b", "--limt", "3"], "moetune plan: unrecognized arguments: --limt 3 (--limt: did you mean --limit?)"),
    (["tune", "qwen3_235b", "--max-trails", "3"], "moetune tune: unrecognized arguments: --max-trails 3 "
                                                  "(--max-trails: did you mean --max-trials?)"),
    (["stage", "export", "--trial", "1", "--forse"], "(--forse: did you mean --force?)"),
    (["status", "--zzzz"], "moetune status: unrecognized arguments: --zzzz (see moetune status --help)"),
    (["predict", "qwen3_235b", "--dispatcher", "nccl"], "moetune predict: argument --dispatcher: invalid choice"),
    (["plan", "qwen3_235b", "--limit", "0"], "moetune plan: argument --limit: 0: give 1 or more"),
    (["bogus"], "moetune: argument COMMAND: invalid choice: 'bogus'"),
    (["analyze", "x.sqlite", "--formt", "json"], "(--formt: did you mean --format?)"),
])
def test_a_usage_error_is_one_line_naming_the_flag_meant(capsys, argv, says):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and says in err and "usage:" not in err, err
    assert captured.out == ""

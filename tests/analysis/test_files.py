"""analysis.files.trace_files: a folder stands for its trace files in rank order (trace_2 before
trace_10), a .sqlite is preferred over the report or archive it was made from, files given by name
keep their order, and a folder without traces is one TraceError naming it."""
import pytest

from moetune.analysis import TraceError
from moetune.analysis.files import trace_files


def test_a_folder_expands_to_its_traces_in_rank_order(tmp_path):
    """A folder expands to its trace_R exports (plain or .xz) in numeric rank order; reports and logs
    are left out."""
    for name in ("trace_10.sqlite", "trace_2.sqlite", "trace_1.nsys-rep", "trace_1.sqlite",
                 "trace_3.sqlite.xz", "log.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in trace_files([tmp_path])] == [
        "trace_1.sqlite", "trace_2.sqlite", "trace_3.sqlite.xz", "trace_10.sqlite"]


def test_files_given_by_name_keep_their_order(tmp_path):
    """Files named one by one are kept in the order given, not sorted."""
    a, b = tmp_path / "b.sqlite", tmp_path / "a.sqlite"
    assert trace_files([a, b]) == [a, b]


def test_a_folder_without_traces_is_one_line_naming_it(tmp_path):
    """A folder with no trace files is a TraceError naming the folder."""
    (tmp_path / "log.txt").write_text("")
    with pytest.raises(TraceError, match=f"{tmp_path}: no trace files"):
        trace_files([tmp_path])

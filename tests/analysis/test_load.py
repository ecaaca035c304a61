"""moetune/analysis/load.py: kernel names qualified by their namespace (template arguments and parameter
lists dropped), and a trace opened from a file that is not a readable nsys export is refused in one
line."""
import pytest

from moetune.analysis import TraceError
from moetune.analysis.load import open_trace, qualified_name
from tests.nsys_fixture import foreign_sqlite


@pytest.mark.parametrize("short, demangled, expected", [
    ("dispatch", "void deep_ep::intranode::dispatch<(int)2, (int)768>(int4 *, float *)",
     "deep_ep::intranode::dispatch"),
    ("vectorized_elementwise_kernel",
     "void at::native::vectorized_elementwise_kernel<4, at::native::sigmoid_kernel_cuda>(int)",
     "at::native::vectorized_elementwise_kernel"),  # template arguments do not leak into the name
    ("ncclDevKernel_SendRecv", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
     "ncclDevKernel_SendRecv"),
    ("kernel", "void (anonymous namespace)::kernel<float>(float *)", "kernel"),
    ("nvjet_sm90_tst_128x256", "", "nvjet_sm90_tst_128x256"),
])
def test_qualified_name(short, demangled, expected):
    """The demangled name's namespace path without return type, template arguments or parameters;
    the short name where nothing is demangled."""
    assert qualified_name(short, demangled) == expected


def test_a_file_that_is_no_nsys_export_is_one_line(tmp_path):
    """A SQLite file of another program, a text file and an empty file each fail in one line that
    names the file."""
    foreign = foreign_sqlite(tmp_path / "foreign.sqlite")
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n")
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    for path in (foreign, text, empty):
        with pytest.raises(TraceError) as e:
            open_trace(path)
        assert path.name in str(e.value) and len(str(e.value).splitlines()) == 1

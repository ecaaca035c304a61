"""Real GPU traces (tests/data/gpu, recorded on H200s): each scenario gets the wall it was built for."""
from pathlib import Path

import pytest

from moetune import analysis

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"

EXPECTED = [
    ("a2a_drowned", "communication"),
    ("big_gemm", "compute"),
    ("tiny_kernels", "host_overhead"),
    ("a2a_hidden", "compute"),
    ("skew", "host_overhead"),
    ("megatron_moe_proxy_ep2", "host_overhead"),
    ("megatron_flex_deepep", "host_overhead"),
]


@pytest.fixture(scope="module")
def traces():
    """The committed traces themselves: the loader decompresses into its cache, not beside them."""
    return DATA


@pytest.mark.parametrize("name, wall", EXPECTED)
def test_scenario_wall(traces, name, wall):
    """Each recorded two-rank GPU scenario is classified as the wall it was built to show."""
    r = analysis.analyze([traces / f"{name}.sqlite.xz"])
    assert r["wall"] == wall, r["evidence"]
    assert r["metrics"]["combined"]["ranks"] == 2


def test_real_trace_metrics_are_consistent(traces):
    """On recorded GPU traces: four captured steps, all-to-all found as NCCL SendRecv and almost wholly
    exposed, busy + idle = 1, and the skew trace's a2a time is mostly waiting."""
    c = analysis.analyze([traces / "a2a_drowned.sqlite.xz"])["metrics"]["combined"]
    assert c["steps"] == 4  # capture range covers iterations 3..6
    assert c["kernel_class_count"]["a2a"] > 0  # all_to_all_single runs as ncclDevKernel_SendRecv
    assert c["exposed_a2a_share"] > 0.9
    assert abs(c["gpu_busy_share"] + c["gpu_idle_share"] - 1) < 1e-3
    skew = analysis.analyze([traces / "skew.sqlite.xz"])["metrics"]["combined"]
    assert skew["a2a_wait_ms"] > 5 * skew["a2a_transfer_ms"]  # waiting, not moving data


def test_megatron_trace_shows_moe_kernels(traces):
    """The recorded Megatron MoE proxy trace shows its GEMMs, its all-to-all and more than 1 GB of peak
    memory."""
    c = analysis.analyze([traces / "megatron_moe_proxy_ep2.sqlite.xz"])["metrics"]["combined"]
    assert c["kernel_class_count"].get("gemm", 0) > 100
    assert c["kernel_class_count"].get("a2a", 0) > 0
    assert c["peak_memory_gb"] > 1


def test_oom_log_is_memory():
    """A recorded out-of-memory log alone gives the memory wall with failure oom."""
    r = analysis.analyze([], log=DATA / "oom.log")
    assert r["wall"] == "memory" and r["log"]["failure"] == "oom"


def test_deepep_kernels_are_recognised_and_their_waits_split_from_transfer(traces):
    """DeepEP's short kernel names are bare (`dispatch`, `combine`): the loader qualifies them with
    the namespace from the demangled name. Its notify kernels spin until the late peer arrives."""
    from moetune.analysis.load import open_trace
    names = set(open_trace(traces / "megatron_flex_deepep.sqlite.xz").kernels["name"].astype(str))
    assert {"deep_ep::intranode::dispatch", "deep_ep::intranode::combine"} <= names
    r = analysis.analyze([traces / "megatron_flex_deepep.sqlite.xz"],
                         log=DATA / "megatron_flex_deepep.log.xz")
    c = r["metrics"]["combined"]
    assert c["kernel_class_count"]["deepep"] > 0 and c["kernel_class_count"]["a2a"] == 0
    assert c["a2a_wait_ms"] > 10 * c["a2a_transfer_ms"] > 0  # spinning for a peer, not moving data
    assert r["wall"] == "host_overhead"


def test_a_compressed_trace_is_decompressed_once_into_the_cache_and_not_beside_it(tmp_path, monkeypatch):
    """A .sqlite.xz trace is decompressed into MOETUNE_CACHE, not beside the input, and a second
    analysis reuses the cached copy with the same result."""
    monkeypatch.setenv("MOETUNE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "in" / "skew.sqlite.xz"
    src.parent.mkdir()
    src.write_bytes((DATA / "skew.sqlite.xz").read_bytes())
    first = analysis.analyze([src])
    assert [p.name for p in src.parent.iterdir()] == ["skew.sqlite.xz"]
    cached = list((tmp_path / "cache" / "traces").glob("*-skew.sqlite"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    assert analysis.analyze([src])["metrics"]["combined"] == first["metrics"]["combined"]
    assert cached[0].stat().st_mtime_ns == stamp  # reused, not written again

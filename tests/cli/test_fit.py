"""cli/fit.py, `moetune fit`: its exit code tells a layout that does not fit (1) from a fit that
could not measure (2), and a rank that could not measure is named by its log's error."""
from __future__ import annotations

from moetune.analysis.logs import parse_log
from moetune.cli.fit import exit_code, render
from moetune.experiment import fit

# what moetune/workloads/train_moe.py prints when the job's interpreter has no Megatron
NO_MEGATRON = ("moetune: this Megatron cannot run the entry: megatron cannot be looked up: "
               "ModuleNotFoundError: No module named 'megatron'; make the image's Megatron importable "
               "(the error named), or use an image with megatron-core >= 0.17\n")


def fitted_from(ranks: dict, capacity_gb: float = 80.0) -> dict:
    return {**fit.verdict(ranks, capacity_gb).to_dict(), "world": 8,
            "ranks": {str(r): m for r, m in ranks.items()}}


def test_a_fit_without_megatron_names_the_missing_module_and_exits_2(tmp_path):
    log = tmp_path / "log_rank_0.txt"
    log.write_text(NO_MEGATRON)
    p = parse_log(log)
    fitted = fitted_from({0: {k: p[k] for k in ("max_allocated_gb", "failure", "failure_line")}})
    assert not fitted["fits"] and fitted["failure"] == "python_error"
    first = render(fitted, "moe_proxy").splitlines()[0]
    assert "rank 0 did not measure" in first and "ModuleNotFoundError: No module named 'megatron'" in first
    assert "no memory report" not in first
    assert exit_code(fitted) == 2


def test_fits_exit_0_and_does_not_fit_or_out_of_memory_exit_1():
    assert exit_code(fitted_from({0: {"max_allocated_gb": 60.0, "max_reserved_gb": 62.0}})) == 0
    assert exit_code(fitted_from({0: {"max_allocated_gb": 76.0, "max_reserved_gb": 77.0}})) == 1
    assert exit_code(fitted_from({0: {"max_allocated_gb": None, "failure": "oom"}})) == 1
    # a log with no memory report and no error: nothing measured either
    assert exit_code(fitted_from({0: {"max_allocated_gb": None, "failure": None}})) == 2

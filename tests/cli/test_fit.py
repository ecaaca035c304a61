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


def test_a_fit_at_another_pp_takes_the_split_predict_prices_not_the_baselines():
    """deepseek_v3's baseline splits 61 layers first 3 / last 2 over PP 16; `fit --pp 8` measures
    the split `predict --pp 8` prices (recomputed, said in one note), which the constraint table
    takes, not the baseline's split, which it refuses at PP 8."""
    import argparse

    from moetune.cli.fit import fit_config
    from moetune.cli.main import refused_layout
    from moetune.cli.predict import add_layout_args, layout_config
    from moetune.experiment.constraints import check
    from moetune.experiment.schema import load_experiment
    exp = load_experiment("deepseek_v3")
    args = argparse.Namespace(tp=None, pp=8, ep=None, etp=None, micro_batch=None)
    notes: list[str] = []
    config = fit_config(exp, args, notes)
    p = argparse.ArgumentParser()
    add_layout_args(p)
    assert config == layout_config(exp.baseline, p.parse_args(["--pp", "8"]), exp.model)
    assert config.pp == 8 and len(notes) == 1 and "recomputed" in notes[0]
    assert check(config, exp.model, exp.cluster) == []
    assert check(exp.baseline.replace(pp=8), exp.model, exp.cluster) != []
    assert refused_layout(exp, config) is exp

"""The fill A/B on the GPU machine (benchmarks/device/fit.sh ab, fit.py --ab) is ready to run: its
layouts are the fit lease's, its extra flags pass Megatron's own parser and make whole steps, and
its table reads which runs were filled from the runs' own log line."""
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from moetune.experiment import megatron_validate as mv

DEVICE = Path(__file__).resolve().parents[2] / "benchmarks" / "device"
SPEC = importlib.util.spec_from_file_location("fit_device", DEVICE / "fit.py")
fit = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fit)
SCRIPT = (DEVICE / "fit.sh").read_text()
LAYOUTS = {lay["name"]: lay for lay in json.loads(fit.LAYOUTS.read_text())}


def _ab_names() -> list[str]:
    (line,) = [ln for ln in SCRIPT.splitlines() if "set -- qwen3_30b_a3b" in ln]
    return line.split("set --", 1)[1].split()


def _extra() -> list[str]:
    return shlex.split(re.search(r'FIT_EXTRA_ARGS="([^"]+)"', SCRIPT)[1])


def test_the_ab_layouts_are_the_lease_ones_under_the_fake_group():
    names = _ab_names()
    assert names == ["qwen3_30b_a3b-baseline-r0", "qwen3_30b_a3b-plan-r0"]
    for name in names:
        assert "--fake-process-group" in LAYOUTS[name]["argv"]


def test_the_ab_step_is_whole_micro_batches_per_data_parallel_rank():
    extra = _extra()
    batch = int(extra[extra.index("--global-batch-size") + 1])
    for name in _ab_names():
        c = LAYOUTS[name]["config"]
        dp = LAYOUTS[name]["world_size"] // (c["tp"] * c["pp"] * c["cp"])
        assert batch % (dp * c["micro_batch"]) == 0 and batch // (dp * c["micro_batch"]) == 4


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_megatron_parses_the_ab_argv():
    argv = LAYOUTS[_ab_names()[0]]["argv"] + _extra()
    assert mv.parser_refusal(argv) is None


def test_a_run_says_whether_it_was_filled():
    on = "moetune: fake process group: filling outputs of skipped collectives (...)\n"
    off = "moetune: fake process group: outputs of skipped collectives left unfilled (MOETUNE_FILL_FAKE=0)\n"
    assert fit.summarize("x", on, 0, 1.0)["filled"] is True
    assert fit.summarize("x", off, 0, 1.0)["filled"] is False
    assert fit.summarize("x", "no such line\n", 0, 1.0)["filled"] is None


def test_the_ab_table_pools_rounds_after_the_first_steps(tmp_path, capsys):
    rows = {"fill0_r1": (False, [9000, 5000, 2000, 2020]), "fill0_r2": (False, [9000, 5000, 1980, 2000]),
            "fill1_r1": (True, [9000, 5000, 2200, 2220]), "fill1_r2": (True, [9000, 5000, 2180, 2200])}
    for folder, (filled, ms) in rows.items():
        (tmp_path / folder).mkdir()
        row = {"name": "qwen3_30b_a3b-baseline-r0", "rc": 0, "filled": filled, "iteration_ms": ms}
        failed = {**row, "name": "other", "rc": 1}  # a failed run counts for nothing
        (tmp_path / folder / "results.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(failed) + "\n")
    assert fit.ab_table(tmp_path) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("qwen3_30b_a3b")]
    assert line.split()[1:] == ["2000", "2200", "+10.0%"]

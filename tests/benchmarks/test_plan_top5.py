"""benchmarks/plan_top5.py: a flagship's section lists plan's five fastest and NVIDIA's layout,
each row's terms adding up to its step."""
import importlib.util
import re
from pathlib import Path

from moetune.estimate import StoreReadings

SPEC = importlib.util.spec_from_file_location(
    "plan_top5", Path(__file__).resolve().parents[2] / "benchmarks" / "plan_top5.py")
assert SPEC and SPEC.loader
top5 = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(top5)


def test_a_flagships_section_lists_five_rows_and_nvidias(no_store):
    """qwen3_30b_a3b: five ranked rows, NVIDIA's parallel layout (ranked) and NVIDIA's own settings;
    every row's terms add up to its ms a step (within the rounding of each to a whole ms)."""
    lines = top5.flagship("qwen3_30b_a3b", StoreReadings.empty())
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| |")]
    assert [r.split(" | ")[0] for r in rows[:5]] == ["| 1", "| 2", "| 3", "| 4", "| 5"]
    assert rows[5].startswith("| NVIDIA's parallel layout, rank ") and rows[6].startswith("| NVIDIA's (qwen3_30b")
    for r in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", r.strip("|"))]  # a layout's pipes are escaped
        step, terms = float(cells[8]), [float(c) for c in cells[9:]]
        assert len(terms) == len(top5.TERMS) and abs(sum(terms) - step) <= len(terms)

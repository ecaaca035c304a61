"""experiment/extra_args.py and the schema's `extra_args`: Megatron flags moetune does not model
pass through as written; one that moetune sets itself, a value with no flag or a multi-line entry
refuses the experiment in one line naming each; a study's stored copy keeps them."""
from pathlib import Path

import pytest
import yaml

from moetune.experiment import megatron_validate
from moetune.experiment.config import TrainingConfig
from moetune.experiment.extra_args import check, controlled_flags
from moetune.experiment.schema import ConfigError, Experiment, load_experiment

REPO = Path(__file__).resolve().parents[2]


def _with_extra(tmp_path, extra) -> Path:
    raw = yaml.safe_load((REPO / "experiments" / "mixtral_8x7b.yaml").read_text())
    raw["extra_args"] = extra
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_extra_args_load_and_survive_the_store(tmp_path):
    """An experiment's extra_args load as written and read back from its stored record."""
    extra = ["--moe-aux-loss-coeff", "0.01", "--hidden-dropout", "0.0"]
    exp = load_experiment(_with_extra(tmp_path, extra))
    assert exp.extra_args == extra
    assert Experiment.from_stored(exp.to_stored()).extra_args == extra
    assert "extra_args" not in load_experiment("mixtral_8x7b").to_stored()  # none: the record as before


def test_flags_moetune_sets_are_refused_naming_each_and_its_key(tmp_path):
    """A model flag, a training-config flag and a run flag: all named in one line, with what sets them."""
    with pytest.raises(ConfigError) as e:
        load_experiment(_with_extra(tmp_path, ["--num-layers", "4", "--tensor-model-parallel-size=2", "--lr", "3e-4"]))
    msg = str(e.value)
    assert "\n" not in msg and "m.yaml: extra_args" in msg
    assert "--num-layers (set by the model section)" in msg
    assert "--tensor-model-parallel-size (set by baseline.tp)" in msg and "--lr (set by moetune's run flags)" in msg


def test_every_flag_moetune_renders_is_controlled():
    """Whatever a trial's argv holds from moetune (model, config, run flags) is a controlled flag."""
    exp = load_experiment("deepseek_v3")
    cfg = exp.baseline.replace(recompute_granularity="full", recompute_num_layers=1, offload_modules=("moe_act",))
    rendered = {t for t in cfg.to_args(exp.model, has_apex=False) if t.startswith("--")}
    assert rendered <= set(controlled_flags())
    local = TrainingConfig(transformer_impl="local").to_args()
    assert {t for t in local if t.startswith("--")} <= set(controlled_flags())


@pytest.mark.parametrize("extra, says", [(["0.01"], "a value with no flag"), (["--x\n--y"], "multi-line"),
                                         ([""], "empty")])
def test_malformed_entries_refused(extra, says):
    with pytest.raises(ValueError, match=says):
        check(extra, "e.yaml: extra_args")


def test_unknown_megatron_option_named_with_the_closest(monkeypatch):
    """An option Megatron's parser lacks is named with the closest one it has (no venv needed)."""
    monkeypatch.setattr(megatron_validate, "available", lambda mcore=None: False)
    why = megatron_validate.check_extra_args(["--moe-aux-loss-coef", "0.01"])
    assert why and "--moe-aux-loss-coef (did you mean --moe-aux-loss-coeff?)" in why
    assert megatron_validate.check_extra_args(["--moe-aux-loss-coeff", "0.01"]) is None


@pytest.mark.megatron
@pytest.mark.skipif(not megatron_validate.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_megatron_parser_refuses_a_bad_value():
    """Megatron's own parser: a value of the wrong type is its refusal; a good list is None."""
    assert megatron_validate.check_extra_args(["--moe-aux-loss-coeff", "lots"])
    assert megatron_validate.check_extra_args(["--moe-aux-loss-coeff", "0.01"]) is None

"""report/export.py, report/megatron_export.py and report/bridge.py: a study's tuned configuration
out as a clean Megatron argument list, Megatron-Bridge overrides and the diff against the baseline,
on a small study written into a store (tests/export_study.py)."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.experiment import megatron_validate as mv
from moetune.experiment.config import TrainingConfig, run_args
from moetune.experiment.schema import load_experiment
from moetune.report import export
from moetune.report import study as report
from moetune.report.bridge import hydra_value, layout_lines
from moetune.report.megatron_export import MEASURING, PLACEHOLDERS, clean_argv, groups
from moetune.store import Store, StoreError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import export_study  # noqa: E402

STUDY = export_study.STUDY
# test values for the placeholders (the engineer's part)
FILLED = {"--data-path": "/data/corpus_text_document", "--tokenizer-type": "NullTokenizer",
          "--tokenizer-model": "/data/tok.model", "--train-iters": "1000", "--lr": "3e-4", "--min-lr": "3e-5",
          "--lr-decay-style": "cosine", "--lr-warmup-iters": "10", "--weight-decay": "0.1", "--clip-grad": "1.0",
          "--init-method-std": "0.02", "--save": "/ckpt", "--save-interval": "500", "--load": "/ckpt"}


@pytest.fixture
def store(tmp_path):
    return export_study.build(tmp_path, force_balance=True)[1]


def shell_argv(text: str, filled: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) a shell sees running the exported snippet, pretrain_gpt.py standing in
    for a program that prints what it was given; `filled`: placeholder lines filled and uncommented."""
    if filled:
        lines = []
        for line in text.splitlines():
            m = re.fullmatch(r"# (--[a-z-]+) [A-Z]+ \\", line)
            lines.append(f"  {m[1]} {filled[m[1]]} \\" if m and m[1] in filled else line)
        text = "\n".join(lines)
    script = "pretrain_gpt.py() { printf '%s\\0' \"$@\"; printf 'ENV\\0'; env -0; }\n" + text
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    argv, _, env = out.partition("ENV\0")
    return argv.split("\0")[:-1], dict(e.split("=", 1) for e in env.split("\0") if "=" in e)


def test_the_default_is_the_trial_the_report_names_best(store):
    c = export.choose(store, STUDY)
    assert (c.view.trial.number, c.best, c.base.trial.number) == (3, True, 1)
    assert "best 250.0 ms (trial 3)" in report.study_markdown(store, STUDY)
    assert export.choose(store, STUDY, 4).best is False


def test_megatron_keeps_every_flag_of_the_trial_but_the_measuring_ones(store):
    """The shell runs the snippet as one command: the trial's own argv with exactly the flags of
    MEASURING_FLAGS left out, each named in a comment with why, and the job's environment exported."""
    c = export.choose(store, STUDY)
    text = export.render(c, "megatron")
    argv, env = shell_argv(text)
    ran = c.config.to_args(c.exp.model, has_apex=c.exp.cluster.has_apex is not False) + run_args()
    kept = [t for flag, values in groups(ran) if flag not in MEASURING for t in (flag, *values)]
    assert argv == kept
    assert not [t for t in argv if t in MEASURING]
    for flag in ("--mock-data", "--train-iters", "--profile-step-start", "--lr", "--tokenizer-type",
                 "--moe-router-force-load-balancing"):
        assert flag in ran
        assert f"#   {flag}" in text and MEASURING[flag].why in text
    assert "--micro-batch-size 4 \\" in text and "--overlap-moe-expert-parallel-comm \\" in text
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"  # the overlap's, exported before the command
    for flag, meta, _ in PLACEHOLDERS:
        assert f"# {flag} {meta} \\" in text.splitlines()


def test_megatron_placeholders_filled_join_the_command(store):
    text = export.render(export.choose(store, STUDY), "megatron")
    argv, _ = shell_argv(text, FILLED)
    assert argv[-2 * len(FILLED):] == [t for flag in FILLED for t in (flag, FILLED[flag])]
    first = dict(list(FILLED.items())[:3])  # filled top to bottom, the rest left commented
    assert shell_argv(text, first)[0] == shell_argv(text)[0] + [t for k, v in first.items() for t in (k, v)]


def test_megatron_values_are_shell_quoted_and_comments_stay_comments(store):
    """A value the shell would expand (DeepSeek-style --moe-layer-freq) reaches the program as one
    word; a name with a newline stays inside its comment line."""
    c = export.choose(store, STUDY)
    c.exp.model = dataclasses.replace(c.exp.model, first_dense_layers=1, name="m\necho pwned")
    argv, _ = shell_argv(export.render(c, "megatron"))
    assert argv[argv.index("--moe-layer-freq") + 1] == c.exp.model.moe_layer_freq() == "([0]*1+[1]*3)"
    assert "pwned" not in " ".join(argv)
    assert all(ln.startswith("#") for ln in export.render(c, "bridge").splitlines() if "pwned" in ln)


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_megatrons_own_parser_and_validation_accept_the_exported_argv(store):
    """The exported argv with its placeholders filled passes Megatron's parse_args, validate_args
    and TransformerConfig; the same argv with a layout Megatron refuses does not (the check bites)."""
    c = export.choose(store, STUDY)
    argv, env = shell_argv(export.render(c, "megatron"), FILLED)
    world = c.exp.cluster.world
    bad = argv + ["--expert-model-parallel-size", "3"]
    results = mv.validate([argv, bad], world, has_te=False, envs=[env, env])
    assert results[0] is None
    assert results[1]


def test_bridge_overrides_name_bridges_fields(store):
    c = export.choose(store, STUDY)
    text = export.render(c, "bridge")
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    pairs = dict(ln.split("=", 1) for ln in lines)
    assert len(pairs) == len(lines)
    assert {k.split(".")[0] for k in pairs} <= {"model", "train", "comm_overlap", "ddp", "optimizer", "dataset",
                                                "mixed_precision"}
    assert pairs["model.expert_model_parallel_size"] == "2"
    assert pairs["model.tensor_model_parallel_size"] == "1"
    assert pairs["model.expert_tensor_parallel_size"] == "1"  # ETP follows TP where unset
    assert pairs["train.micro_batch_size"] == "4" and pairs["train.global_batch_size"] == "16"
    assert pairs["comm_overlap.overlap_moe_expert_parallel_comm"] == "true"
    assert pairs["model.moe_token_dispatcher_type"] == "alltoall"
    assert pairs["mixed_precision"] == "bf16_mixed"
    assert "train.train_iters" not in pairs and "dataset.mock" not in pairs
    assert "# train.train_iters=<N>" in text  # a placeholder, not the trials' 16
    assert "# no Bridge field: --transformer-impl (--transformer-impl local)" in text
    assert "# model.num_moe_experts=16" in text and "# model.gated_linear_unit=true" in text
    assert "# CUDA_DEVICE_MAX_CONNECTIONS=32" in text
    assert "--moe-router-force-load-balancing" in text and "model.moe_router_force_load_balancing" not in text


def test_bridge_precision_recompute_and_quoting():
    cfg = TrainingConfig(fp8_format="e4m3", fp8_recipe="mxfp8", recompute_granularity="selective",
                         recompute_modules=("moe_act", "layernorm"), cuda_graph_impl="transformer_engine",
                         cuda_graph_modules=("attn", "moe_router"))
    out = layout_lines(cfg, 4096)
    assert "mixed_precision=bf16_with_mxfp8_mixed" in out
    assert "'model.recompute_modules=[moe_act,layernorm]'" in out
    assert "'model.cuda_graph_scope=[attn,moe_router]'" in out
    assert "model.seq_length=4096" in out and "dataset.seq_length=4096" in out
    full = layout_lines(TrainingConfig(recompute_granularity="full", recompute_num_layers=1), 4096)
    assert "model.recompute_method=uniform" in full and "model.recompute_num_layers=1" in full
    assert "# model.moe_deepep_num_sms: the recipe's (the trials left it at Megatron's default)" in full
    assert hydra_value("([0]*3+[1]*58)") == "'([0]*3+[1]*58)'" and hydra_value("it's") == "'it\\'s'"


def test_bridge_overrides_of_megatron_fsdp():
    """FSDP on: Bridge's two FSDP switches, the sharding strategy and the checkpoint format it needs;
    off: none of them, and no comment calling them missing."""
    out = layout_lines(TrainingConfig(fsdp=True, fsdp_sharding="optim_grads"), 4096)
    for line in ("dist.use_megatron_fsdp=true", "ddp.use_megatron_fsdp=true",
                 "ddp.data_parallel_sharding_strategy=optim_grads", "checkpoint.ckpt_format=fsdp_dtensor"):
        assert line in out, line
    plain = "\n".join(layout_lines(TrainingConfig(), 4096))
    assert "fsdp" not in plain and "sharding" not in plain

def test_diff_names_each_change_its_decision_and_evidence(store):
    text = export.render(export.choose(store, STUDY), "diff")
    rows = {r.split(" | ")[0].strip("| `"): r for r in text.splitlines() if r.startswith("| `")}
    assert set(rows) == {"--micro-batch-size", "--overlap-moe-expert-parallel-comm", "env CUDA_DEVICE_MAX_CONNECTIONS"}
    mb = rows["--micro-batch-size"]
    assert "| 2 | 4 |" in mb and "trial 2 larger_micro_batch" in mb and "moe-optimization-workflow.md" in mb
    assert "trial 1 → 2: 400.0 → 300.0 ms (keep, p=0.01)" in mb
    ov = rows["--overlap-moe-expert-parallel-comm"]
    assert "(not set) | (on)" in ov and "trial 2 → 3: 300.0 → 250.0 ms (keep" in ov and "megatron-core-moe-readme" in ov
    assert "400.0 ms (trial 1) → 250.0 ms (trial 3), 1.60x" in text


def test_diff_of_a_reverted_trial(store):
    text = export.render(export.choose(store, STUDY, 4), "diff")
    for flag in ("--recompute-granularity", "--recompute-method", "--recompute-num-layers"):
        row = next(r for r in text.splitlines() if r.startswith(f"| `{flag}`"))
        assert "trial 4 recompute_full" in row and "300.0 → 360.0 ms (revert, p=0.9)" in row
    assert "--overlap-moe-expert-parallel-comm" not in text  # trial 3 is not on its way


def test_no_such_study_or_trial_or_a_trial_that_never_completed(store):
    with pytest.raises(StoreError, match="no study named 'nope'"):
        export.choose(store, "nope")
    with pytest.raises(export.ExportError, match="has no trial 9; its trials are 1..5"):
        export.choose(store, STUDY, 9)
    with pytest.raises(export.ExportError, match=r"trial 5 never completed \(state failed\)"):
        export.choose(store, STUDY, 5)


def test_a_study_without_a_judged_trial_has_nothing_to_export(tmp_path):
    st = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    study = st.create_study("s", "moe_proxy", {})
    st.add_trial(study.id, TrainingConfig().to_dict(), TrainingConfig().config_hash())
    with pytest.raises(export.ExportError, match="no trial has a judged step time yet"):
        export.choose(st, "s")
    md, _ = report.write_reports(st, "s", tmp_path / "reports")
    assert "## Export" not in md.read_text() and not (tmp_path / "reports" / "export").exists()


def test_the_report_writes_the_exports_beside_itself_and_links_them(store, tmp_path):
    md, html = report.write_reports(store, STUDY, tmp_path / "reports")
    c = export.choose(store, STUDY)
    folder = tmp_path / "reports" / "export" / STUDY
    for fmt, name in export.EXPORT_FILES:
        assert (folder / name).read_text() == export.render(c, fmt)
    text = md.read_text()
    assert f"moetune export {STUDY} --format megatron|bridge|diff" in text
    assert f"[export/{STUDY}/megatron.sh](export/{STUDY}/megatron.sh)" in text
    assert f'<a href="export/{STUDY}/diff.md">' in html.read_text()


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_the_shipped_production_baselines_exported_pass_megatrons_validation():
    """Every shipped experiment's baseline, as a real run of it (the clean argv and the placeholders
    filled), passes Megatron's validation at its cluster's world size: leaving the measuring flags
    out leaves nothing Megatron needs out."""
    names = ("qwen3_235b", "qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b", "mixtral_8x22b")
    exps = [load_experiment(n) for n in names]
    filled = [t for k, v in FILLED.items() for t in (k, v)]
    argvs = [clean_argv(e, e.baseline) + filled for e in exps]
    assert all(not set(a) & set(MEASURING) - set(FILLED) for a in argvs)
    results = mv.validate(argvs, [e.cluster.world for e in exps])
    assert dict(zip(names, results, strict=True)) == {n: None for n in names}

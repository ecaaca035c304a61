"""Predicted against measured, for docs/prediction.md: (a) every completed multi-GPU trial of the
trial bank (data/trial_bank: moe_proxy on 2x H200), (b) the public H100 MoE figures listed
with their sources in benchmarks/predict_validation.yaml. Analytic compute with the rate table as
shipped (its efficiencies calibrated on moetune's own trials, benchmarks/predict_calibration.py);
nothing here is fitted to the figures it is compared with.

    .venv/bin/python benchmarks/predict_validation.py [--format text|json]

Step-time error: predicted step / measured step - 1 (for the public rows, measured tokens/s/GPU
over predicted). Pairs: every two rows of one model with different layouts whose measurements
differ by more than 10 %, and whether the prediction orders them the same way."""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from moetune.analysis import figures
from moetune.analysis.logs import parse_log
from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import load_experiment
from moetune.estimate.memory import padded_vocab
from moetune.estimate import Node, StoreReadings, predict, price

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "benchmarks" / "predict_validation.yaml"
BANK = ROOT / "data" / "trial_bank" / "bank.jsonl"
LAYOUT = ("tp", "pp", "vpp", "ep", "etp", "cp", "micro_batch", "global_batch", "seq_length")
PAIR_GAP = 0.10


@functools.cache
def imported_experiment(name: str, hf_config: str, gpus: int):
    """The experiment `moetune new NAME --from-hf CONFIG --gpus N` writes (a model moetune imports
    rather than ships), loaded from a scratch file."""
    from moetune.cli import new
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / f"{name}.yaml"
        with contextlib.redirect_stdout(io.StringIO()):
            if new.main([name, "--from-hf", str(ROOT / hf_config), "--gpus", str(gpus), "--out", str(out)]):
                raise SystemExit(f"{hf_config}: moetune new could not import it")
        return load_experiment(out)


def megatron_flop_per_token(model, seq: int, tp: int, causal: bool) -> float:
    """Model FLOPs a token (forward and backward) as Megatron-LM's training loop counts them for a
    GQA/MHA model with gated MLPs: 12 x layers x hidden x (attention projections, score and value
    products, MLP or routed and shared experts) plus the logits; `causal`: only half the score matrix
    (Megatron-LM from 2025), else all of it (MCore v0.8). Turns a published TFLOP/s/GPU into tokens/s."""
    if model.multi_latent_attention:
        raise ValueError(f"{model.name}: the MLA FLOP count is not written here")
    h, layers = model.hidden_size, model.num_layers
    q_ratio = (model.kv_channels or h // model.num_attention_heads) * model.num_attention_heads / h
    moe = sum(model.moe_layer_pattern) if model.moe_layer_pattern else layers - model.first_dense_layers
    attn = h * h * (1 + model.num_query_groups / model.num_attention_heads
                    + seq / h * (0.5 if causal else 1.0)) * q_ratio
    mlp = h * 1.5 * (model.ffn_hidden_size * (layers - moe) / layers
                     + (model.moe_ffn_hidden_size * model.moe_router_topk
                        + (model.moe_shared_expert_intermediate_size or 0)) * moe / layers)
    return 12 * layers * (attn + mlp) + 6 * h * padded_vocab(model, tp)


def measured_tokens(row: dict, model) -> float:
    """The row's published figure as tokens/s/GPU: as given, from a step time, or from model
    TFLOP/s/GPU under the FLOP count its `flop_count` names."""
    lay = row["layout"]
    if row.get("tokens_per_s_per_gpu"):
        return row["tokens_per_s_per_gpu"]
    if row.get("step_time_s"):
        return round(lay["global_batch"] * lay["seq_length"] / row["gpus"] / row["step_time_s"], 1)
    causal = {"megatron_causal": True, "megatron_v0.8": False}[row["flop_count"]]
    return round(row["tflops_per_gpu"] * 1e12
                 / megatron_flop_per_token(model, lay["seq_length"], lay.get("tp", 1), causal), 1)


def row_config(exp, common: dict, row: dict) -> TrainingConfig:
    """The config a row prices: the shipped experiment's baseline with the file's common settings,
    the row's settings and its layout. An imported model's baseline is the layout its own plan chose
    (FSDP, an uneven pipeline...): its rows start from Megatron's defaults instead, so that only what
    was published is priced."""
    base = TrainingConfig() if row.get("hf_config") else exp.baseline
    return base.replace(**{**common, **row["settings"], **row["layout"]})


def public_rows(path: Path = PUBLIC, skip_unknown: bool = False) -> list[dict]:
    """Each row priced as `moetune predict` prices it with nothing measured in the store (the
    published rates and the shipped tables). `skip_unknown`: leave out a row whose settings name a
    field this moetune's TrainingConfig lacks (an older, frozen model), rather than fail."""
    data = yaml.safe_load(path.read_text())
    out = []
    for row in data["rows"]:
        exp = (imported_experiment(row["model"], row["hf_config"], row["gpus"]) if row.get("hf_config")
               else load_experiment(row["model"]))
        try:
            config = row_config(exp, data["common"], row)
        except TypeError:
            if skip_unknown:
                continue
            raise
        p = price(exp, config, StoreReadings.empty(), gpus=row["gpus"], gpu_type="H100")
        measured = measured_tokens(row, exp.model)
        out.append({"id": row["id"], "model": row["model"], "release": row["release"],
                    "table": row.get("table") or row["release"],
                    "hardware": row["hardware"], "source": row["source"], "section": row["section"],
                    "layout": {k: row["layout"].get(k) for k in LAYOUT}, "settings": row["settings"],
                    "measured": measured, "predicted": round(p.tokens_per_s_per_gpu, 1),
                    "error": measured / p.tokens_per_s_per_gpu - 1,
                    "step_ms": round(p.step_time_ms, 1),
                    # the slowest stage's compute a micro-batch, by kind of kernel
                    "compute_parts_ms": {k: round(v, 1) for k, v in p.inputs.get("compute_parts_ms", {}).items()},
                    "terms": {k: round(v, 1) for k, v in p.terms.items()}})
    return out


def bank_rows(path: Path = BANK) -> list[dict]:
    """The bank's completed trials on 2 GPUs: one node of 2 H200 joined by NVLink."""
    out = []
    for e in map(json.loads, path.read_text().splitlines()):
        if e["gpus"] < 2 or e["state"] != "COMPLETED" or not e.get("step_time_ms"):
            continue
        exp = load_experiment("moe_proxy_te" if e["name"].startswith("te_") else "moe_proxy")
        c = TrainingConfig.from_dict(e["config"])
        p = predict(exp.model, c, Node("H200", 2, 2, has_apex=False), e["gpus"])  # the device machine's image
        # the step time as the tuner judges it (moetune/analysis/figures.py): the log's steady median
        judged = figures.judged_step({"log": parse_log(path.parent / e["log"]),
                                      "metrics": {"combined": {"step_time_ms": e["step_time_ms"]}}})
        ms = judged["step_time_ms"]
        out.append({"id": e["name"], "measured_ms": ms, "profiled_ms": e["step_time_ms"],
                    "predicted_ms": round(p.step_time_ms, 1), "error": p.step_time_ms / ms - 1,
                    "terms": {k: round(v, 1) for k, v in p.terms.items()}})
    return out


def pairs(rows: list[dict]) -> list[dict]:
    out = []
    for a, b in itertools.combinations(rows, 2):
        if a["model"] != b["model"] or a["layout"] == b["layout"]:
            continue
        gap = max(a["measured"], b["measured"]) / min(a["measured"], b["measured"]) - 1
        if gap <= PAIR_GAP:
            continue
        right = (a["measured"] > b["measured"]) == (a["predicted"] > b["predicted"])
        same = a["table"] == b["table"]
        out.append({"faster": a["id"] if a["measured"] > b["measured"] else b["id"],
                    "slower": b["id"] if a["measured"] > b["measured"] else a["id"],
                    "gap": gap, "ranked_right": right, "one_table": same,
                    "layouts": sorted((key(a), key(b)))})
    for p in out:  # the same two layouts measured the other way round in another pair of tables
        p["measurements_disagree"] = any(q["layouts"] == p["layouts"] and q["faster"] != p["faster"]
                                         and key_of(rows, q["faster"]) != key_of(rows, p["faster"]) for q in out)
    return out


def key(row: dict) -> str:
    return json.dumps(row["layout"], sort_keys=True)


def key_of(rows: list[dict], row_id: str) -> str:
    return key(next(r for r in rows if r["id"] == row_id))


def pair_summary(ps: list[dict]) -> dict:
    one = [p for p in ps if p["one_table"]]
    consistent = [p for p in ps if not p["one_table"] and not p["measurements_disagree"]]
    right = lambda group: sum(p["ranked_right"] for p in group)  # noqa: E731
    one_way = [p for p in ps if not p["measurements_disagree"]]
    return {"all": len(ps), "all_right": right(ps), "one_table": len(one), "one_table_right": right(one),
            "consistent": len(consistent), "consistent_right": right(consistent),
            "one_way": len(one_way), "one_way_right": right(one_way),
            "both_ways": len(ps) - len(one_way), "both_ways_right": right(ps) - right(one_way)}


def median_abs(rows: list[dict]) -> float:
    return statistics.median(abs(r["error"]) for r in rows)


def report() -> dict:
    pub, bank = public_rows(), bank_rows()
    ps = pairs(pub)
    return {"public": pub, "public_median_abs_error": round(median_abs(pub), 3), "pairs": ps,
            "pair_summary": pair_summary(ps),
            "bank": bank, "bank_median_abs_error": round(median_abs(bank), 3)}


def render(r: dict) -> str:
    lay = lambda l: (f"TP{l['tp']} PP{l['pp']}" + (f" VP{l['vpp']}" if l["vpp"] else "")  # noqa: E731
                     + f" EP{l['ep']} MBS{l['micro_batch']} GBS{l['global_batch']}")
    lines = ["| row | release | layout | settings | measured tok/s/GPU | predicted | step-time error |",
             "|---|---|---|---|---|---|---|"]
    for p in r["public"]:
        s = ", ".join(f"{k}={v}" for k, v in p["settings"].items())
        lines.append(f"| {p['id']} | {p['release']} | {lay(p['layout'])} | {s} | {p['measured']} | "
                     f"{p['predicted']:.0f} | {p['error']:+.1%} |")
    lines.append(f"\npublic: median absolute step-time error {r['public_median_abs_error']:.1%} "
                 f"over {len(r['public'])} rows\n")
    lines += ["| faster (measured) | slower | measured gap | one table | measured the other way elsewhere | "
              "model ranks them |", "|---|---|---|---|---|---|"]
    for p in r["pairs"]:
        lines.append(f"| {p['faster']} | {p['slower']} | {p['gap']:.0%} | {'yes' if p['one_table'] else 'no'} | "
                     f"{'yes' if p['measurements_disagree'] else 'no'} | {'right' if p['ranked_right'] else 'WRONG'} |")
    s = pair_summary(r["pairs"])
    lines.append(f"\npairs more than {PAIR_GAP:.0%} apart: {s['all']} ({s['all_right']} ranked right); "
                 f"within one table: {s['one_table']} ({s['one_table_right']} right); across tables and not "
                 f"contradicted by another measurement of the same two layouts: {s['consistent']} "
                 f"({s['consistent_right']} right); ordered one way by every measurement of the two layouts: "
                 f"{s['one_way']} ({s['one_way_right']} right); measured both ways: {s['both_ways']} "
                 f"({s['both_ways_right']} right)\n")
    lines += ["| bank trial (2x H200) | judged ms (log median) | profiled ms (trace mean) | predicted ms | error |",
              "|---|---|---|---|---|"]
    for b in r["bank"]:
        lines.append(f"| {b['id']} | {b['measured_ms']:.0f} | {b['profiled_ms']:.0f} | {b['predicted_ms']:.0f} | "
                     f"{b['error']:+.1%} |")
    lines.append(f"\ntrial bank: median absolute step-time error {r['bank_median_abs_error']:.1%} "
                 f"over {len(r['bank'])} trials")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--format", choices=("text", "json"), default="text")
    a = p.parse_args(argv)
    r = report()
    print(json.dumps(r, indent=1) if a.format == "json" else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

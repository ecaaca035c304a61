"""How often the measured step falls inside the prediction's band (moetune/estimate/band.py), over
the public H100 rows of benchmarks/predict_validation.yaml, priced as predict_validation.py prices
them (analytic compute, the rate table as shipped).

    .venv/bin/python benchmarks/predict_band.py"""
from __future__ import annotations

import statistics

import predict_validation  # beside this script
import yaml

from moetune.estimate import Node, predict
from moetune.estimate.band import band
from moetune.estimate.memory import plan_cluster
from moetune.estimate.rates import Rates
from moetune.experiment.schema import load_experiment


def rows() -> list[dict]:
    """Each public row: measured and predicted step (s), the band's ends, its dominant rows."""
    data = yaml.safe_load(predict_validation.PUBLIC.read_text())
    out = []
    for row in data["rows"]:
        exp = load_experiment(row["model"])
        cluster, world, _ = plan_cluster(exp, row["gpus"], "H100")
        config = exp.baseline.replace(**{**data["common"], **row["settings"], **row["layout"]})
        node = Node.of(cluster)
        p = predict(exp.model, config, node, world)
        def step_ms(r, exp=exp, config=config, node=node, world=world) -> float:
            return predict(exp.model, config, node, world, rates=r).step_time_ms
        b = band(step_ms, Rates(), p.step_time_ms)
        seq = row["layout"]["seq_length"]
        tokens = row["layout"]["global_batch"] * seq / row["gpus"]
        measured = row.get("step_time_s") or tokens / row["tokens_per_s_per_gpu"]
        out.append({"id": row["id"], "measured_s": measured, "predicted_s": p.step_time_ms / 1e3,
                    "low_s": b.low_ms / 1e3, "high_s": b.high_ms / 1e3,
                    "dominant": [r.name for r in b.dominant()]})
    return out


def main() -> int:
    rs = rows()
    print("| row | measured s | predicted s (band) | inside | band mostly from |\n|---|---|---|---|---|")
    for r in rs:
        inside = r["low_s"] <= r["measured_s"] <= r["high_s"]
        print(f"| {r['id']} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} ({r['low_s']:.2f}-{r['high_s']:.2f}) "
              f"| {'yes' if inside else 'no'} | {', '.join(r['dominant'])} |")
    inside = sum(r["low_s"] <= r["measured_s"] <= r["high_s"] for r in rs)
    width = statistics.median((r["high_s"] - r["low_s"]) / r["predicted_s"] for r in rs)
    print(f"\nmeasured inside the band: {inside} of {len(rs)} rows; median band width {width:.0%} of the prediction")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The step-time model scored on public runs it was not shaped on, for docs/prediction.md's "Scored on
unseen runs". Two sets, kept apart: the rows looked at while the model was built
(benchmarks/predict_validation.yaml) and the rows collected after the model was frozen
(benchmarks/predict_scoring.yaml, its `frozen_commit`). Each set is priced by the frozen model (a
checkout of that commit, --frozen DIR) and by this checkout's model, with benchmarks/predict_validation.py's
functions.

    git worktree add /tmp/frozen 486cbc4
    .venv/bin/python benchmarks/predict_scoring.py --frozen /tmp/frozen [--format text|json]

Reported a set and a model: the median |error| over rows and over distinct layouts (a layout
measured several times, in several releases, counts once: the median of its measurements), the
signed errors, and the pairs (two layouts of one model more than 10 % apart in measured speed:
does the model order them the same way?). Error: predicted step / measured step - 1 (+: the model
is slower). Results to benchmarks/results/predict_scoring.json."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import predict_validation as pv  # noqa: E402

ROOT = pv.ROOT
UNSEEN = ROOT / "benchmarks" / "predict_scoring.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "predict_scoring.json"
SETS = {"built_on": pv.PUBLIC, "unseen": UNSEEN}


def config_key(row: dict) -> str:
    """One priced configuration: the model, the layout and the recipe's settings."""
    return json.dumps([row["model"], row["layout"], row["settings"]], sort_keys=True)


def by_layout(rows: list[dict]) -> list[dict]:
    """The rows merged per distinct configuration: measured is the median of its measurements, the
    prediction the model's one for it (the median, should a set price it twice)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(config_key(r), []).append(r)
    out = []
    for members in groups.values():
        measured = statistics.median(r["measured"] for r in members)
        predicted = statistics.median(r["predicted"] for r in members)
        tables = {r["table"] for r in members}
        first = members[0]
        out.append({"id": first["id"] if len(members) == 1 else f"{first['id']} (x{len(members)})",
                    "rows": [r["id"] for r in members], "model": first["model"],
                    # settings are part of what was priced: two settings of one layout are two entries
                    "layout": {**first["layout"], **first["settings"]},
                    "table": tables.pop() if len(tables) == 1 else "several",
                    "measured": measured, "predicted": predicted, "error": measured / predicted - 1})
    return out


def term_shares(rows: list[dict]) -> dict[str, float]:
    """Each term's median share of the predicted step over the rows: where the predicted time goes."""
    names = sorted({k for r in rows for k in r["terms"]})
    shares = {k: statistics.median(r["terms"].get(k, 0.0) / sum(r["terms"].values()) for r in rows) for k in names}
    return {k: round(v, 3) for k, v in shares.items()}


def score(rows: list[dict]) -> dict:
    """A set's score under one model: errors over rows and over distinct layouts, signed and absolute,
    and rank agreement on pairs of rows and of distinct layouts."""
    layouts = by_layout(rows)
    signed = [r["error"] for r in rows]
    return {"rows": len(rows), "layouts": len(layouts),
            "median_abs_error": round(pv.median_abs(rows), 3),
            "median_signed_error": round(statistics.median(signed), 3),
            "slow_rows": sum(e > 0 for e in signed), "fast_rows": sum(e < 0 for e in signed),
            "layout_median_abs_error": round(pv.median_abs(layouts), 3),
            "layout_median_signed_error": round(statistics.median(r["error"] for r in layouts), 3),
            "pairs": pv.pair_summary(pv.pairs(rows)),
            "layout_pairs": pv.pair_summary(pv.pairs(layouts)),
            "by_layout": [{k: (round(v, 3) if k == "error" else v) for k, v in g.items()} for g in layouts],
            "term_shares": term_shares(rows)}


def priced(rows_file: Path, checkout: Path | None) -> list[dict]:
    """The rows of `rows_file` priced by the moetune of `checkout` (a separate interpreter with that
    tree first on its path), or by this one's when None."""
    if checkout is None:
        return pv.public_rows(rows_file)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, __file__, "--price-only", str(rows_file)], env=env, cwd=checkout,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"pricing {rows_file.name} with {checkout}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def frozen_commit(rows_file: Path = UNSEEN) -> str:
    return str(yaml.safe_load(rows_file.read_text())["frozen_commit"])


def check_frozen(checkout: Path, commit: str) -> str:
    """The checkout's HEAD, refused unless it is the frozen commit and its tree is clean."""
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    if not head.startswith(commit):
        raise SystemExit(f"--frozen {checkout}: its HEAD is {head or 'not a git checkout'}, not {commit}")
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    if dirty:
        raise SystemExit(f"--frozen {checkout}: has changes; the frozen model is the commit as it is")
    return head


def report(frozen: Path | None, sets: dict[str, Path] = SETS) -> dict:
    models = {"current": None, **({"frozen": frozen} if frozen else {})}
    out: dict = {"frozen_commit": frozen_commit(sets["unseen"]),
                 "frozen_checkout_head": check_frozen(frozen, frozen_commit(sets["unseen"])) if frozen else None}
    for set_name, path in sets.items():
        for model, checkout in models.items():
            rows = priced(path, checkout)
            name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
            out[f"{set_name}/{model}"] = {"file": name, **score(rows), "rows_priced": rows}
    return out


def render(r: dict) -> str:
    lines = [f"frozen model: {r['frozen_commit']}", "",
             "| set | model | rows | median abs error | median signed | slow/fast rows | distinct layouts | "
             "median abs error a layout | pairs right | pairs of layouts right |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, s in r.items():
        if "/" not in key:
            continue
        p, lp = s["pairs"], s["layout_pairs"]
        lines.append(f"| {key.split('/')[0]} | {key.split('/')[1]} | {s['rows']} | {s['median_abs_error']:.1%} | "
                     f"{s['median_signed_error']:+.1%} | {s['slow_rows']}/{s['fast_rows']} | {s['layouts']} | "
                     f"{s['layout_median_abs_error']:.1%} | {p['all_right']}/{p['all']} | "
                     f"{lp['all_right']}/{lp['all']} |")
    unseen = r.get("unseen/frozen") or r["unseen/current"]
    lines += ["", "| unseen row | measured tok/s/GPU | predicted | error | largest terms (ms a step) | "
              "attention's share of compute |", "|---|---|---|---|---|---|"]
    for row in unseen["rows_priced"]:
        top = sorted(row["terms"].items(), key=lambda kv: -kv[1])[:3]
        parts = row.get("compute_parts_ms") or {}
        attn = f"{parts['attention'] / sum(parts.values()):.0%}" if parts.get("attention") else "-"
        lines.append(f"| {row['id']} | {row['measured']:.0f} | {row['predicted']:.0f} | {row['error']:+.1%} | "
                     + ", ".join(f"{k} {v:.0f}" for k, v in top) + f" | {attn} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frozen", type=Path, default=None, help="a checkout of the frozen commit")
    p.add_argument("--rows", type=Path, default=UNSEEN, help="the unseen set (default predict_scoring.yaml)")
    p.add_argument("--out", type=Path, default=RESULTS, help="the JSON written")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--price-only", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.price_only:
        print(json.dumps(pv.public_rows(a.price_only, skip_unknown=True)))
        return 0
    r = report(a.frozen, {"built_on": pv.PUBLIC, "unseen": a.rows.resolve()})
    a.out.write_text(json.dumps(r, indent=1) + "\n")
    print(json.dumps(r, indent=1) if a.format == "json" else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

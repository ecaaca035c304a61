"""cli/plan.py, `moetune plan`: `--format json` gives estimate_gb (and measured_gb where the store holds a measured
run of the layout); `--baseline` lists the experiment's baseline even where it does not fit."""
import json

import pytest

from moetune.cli.main import main
from moetune.estimate.memory import FIXED_GB
from moetune.experiment.gpus import GPUS
from moetune.experiment.schema import load_experiment
from moetune.store import Store
from tests.conftest import proxy_variant

QWEN_BASELINE_MEASURED_GB = 85919.27 / 1024  # benchmarks/fit_lease: rank 0 on one H200, max allocated
# qwen3_235b's former baseline, TP2 PP2 EP32 without recompute (the fit lease's layout), which an
# H100 cannot hold: the layout flags give it back
OLD_QWEN = ["--pp", "2", "--vpp", "1", "--recompute", "none"]


def _json(capsys, argv):
    """Exit code and the layouts `plan --format json` shows."""
    capsys.readouterr()
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)["layouts"]


def test_json_gives_the_search_counts_the_text_prints(capsys, no_store):
    """`--format json` carries what the search went through, the same counts as the text's two
    lines; --limit cuts the rows shown, not the search; --baseline searches nothing (null)."""
    from moetune.cli.plan import search_counts
    from moetune.estimate.readings import StoreReadings
    from moetune.estimate.search import search
    capsys.readouterr()
    assert main(["plan", "qwen3_30b_a3b", "--format", "json", "--limit", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    counts = out["search"]
    assert len(out["layouts"]) == 3 and counts["fit"] > 3 and out["world"] == 16
    assert counts["considered"] == counts["fit"] + sum(counts["dropped"].values())
    found = search(load_experiment("qwen3_30b_a3b"), StoreReadings.empty(), limit=3)
    assert found.space.counts() == counts
    assert search_counts(found.space)[0].startswith(f"searched {counts['considered']} layouts: {counts['fit']} fit")
    capsys.readouterr()
    main(["plan", "qwen3_30b_a3b", "--baseline", "--format", "json"])
    assert json.loads(capsys.readouterr().out)["search"] is None


def test_baseline_listed_though_it_does_not_fit_an_h100(capsys, no_store):
    """--baseline lists qwen3_235b's former baseline on 256 H100s with fits false, its estimate within
    10 % of the fit lease's measured peak, exit 1; the full plan leaves it out."""
    rc, rows = _json(capsys, ["plan", "qwen3_235b", "--gpus", "256", "--gpu-type", "H100", "--baseline",
                              "--format", "json", *OLD_QWEN])
    assert rc == 1 and len(rows) == 1  # does not fit: the same exit code as the text
    (row,) = rows
    assert {k: row["config"][k] for k in ("tp", "pp", "ep")} == {"tp": 2, "pp": 2, "ep": 32}
    assert row["fits"] is False and row["capacity_gb"] == GPUS["H100"].memory_gb and row["refused"] == []
    assert row["estimate_gb"] == pytest.approx(QWEN_BASELINE_MEASURED_GB, rel=0.10)
    assert row["memory_gb"] == pytest.approx(row["estimate_gb"] + FIXED_GB, abs=0.01)
    assert "measured_gb" not in row  # no store here
    # the full plan does not list it: it is not feasible on an 80 GB H100
    _, rows = _json(capsys, ["plan", "qwen3_235b", "--gpus", "256", "--gpu-type", "H100", "--format", "json",
                             "--limit", "50"])
    assert rows and all(r["fits"] for r in rows)
    assert not any(r["config"]["tp"] == 2 and r["config"]["pp"] == 2 and r["config"]["ep"] == 32 for r in rows)
    # on an H200 the same baseline fits
    _, (row,) = _json(capsys, ["plan", "qwen3_235b", "--gpu-type", "H200", "--baseline", "--format", "json",
                               *OLD_QWEN])
    assert row["fits"] is True and row["capacity_gb"] == GPUS["H200"].memory_gb


def test_baseline_text_says_it_does_not_fit(capsys, no_store):
    """The text form names the baseline's layout and GPUs and ends saying it does NOT fit."""
    assert main(["plan", "qwen3_235b", "--gpus", "256", "--gpu-type", "H100", "--baseline", *OLD_QWEN]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("qwen3_235b baseline TP2 PP2 EP32 on 256x H100") and out.endswith("does NOT fit")


def test_measured_gb_from_the_store(capsys, tmp_path, monkeypatch):
    """A fit of the baseline in the store gives its measured_gb; another layout's measured figure is
    not taken for it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOETUNE_DB", str(tmp_path / "db.sqlite"))
    exp = load_experiment("qwen3_235b")
    store = Store()
    study = store.create_study("fit-qwen", exp.model.name, {"cluster": exp.cluster.model_dump()})
    old = exp.baseline.replace(pp=2, vpp=None, account_for_embedding=False, account_for_loss=False,
                               recompute_granularity=None, recompute_modules=())
    fit = old.replace(capacity_factor=1.0, pad_to_capacity=True, train_iters=3)  # as the fit ran
    t = store.add_trial(study.id, fit.to_dict(), fit.config_hash())
    store.update_trial(t.id, state="completed", peak_memory_gb=QWEN_BASELINE_MEASURED_GB)
    other = old.replace(tp=4, ep=64)  # another layout: its figure must not be taken
    t2 = store.add_trial(study.id, other.to_dict(), other.config_hash())
    store.update_trial(t2.id, state="completed", peak_memory_gb=1.0)
    _, (row,) = _json(capsys, ["plan", "qwen3_235b", "--baseline", "--format", "json", *OLD_QWEN])
    assert row["measured_gb"] == pytest.approx(QWEN_BASELINE_MEASURED_GB, abs=0.01)
    assert row["estimate_gb"] == pytest.approx(row["measured_gb"], rel=0.10)
    # at another GPU count the measurement is not this layout's (the optimizer shards differ)
    _, (row,) = _json(capsys, ["plan", "qwen3_235b", "--gpus", "128", "--baseline", "--format", "json", *OLD_QWEN])
    assert "measured_gb" not in row


def test_measured_gb_from_the_store_named_by_db(capsys, no_store):
    """moetune --db STORE plan: the recorded one-GPU study (benchmarks/one_gpu_tuning) measured
    qwen3_30b_a3b's baseline layout on one H100 at 65.6 GB; plan shows it beside the estimate."""
    from moetune.paths import ROOT
    db = str(ROOT / "benchmarks" / "one_gpu_tuning" / "moetune.db")
    _, (row,) = _json(capsys, ["--db", db, "plan", "qwen3_30b_a3b", "--baseline", "--format", "json"])
    assert row["measured_gb"] == pytest.approx(65.58, abs=0.01)
    assert row["estimate_gb"] == pytest.approx(row["measured_gb"], rel=0.10)
    _, (row,) = _json(capsys, ["plan", "qwen3_30b_a3b", "--baseline", "--format", "json"])
    assert "measured_gb" not in row  # without --db: the (absent) default store


def test_a_layout_measured_to_fit_is_planned_though_its_estimate_is_not(capsys, no_store):
    """qwen3_235b's TP2 PP2 EP128 on 256 H100, measured at 68.9 GB by the one-GPU study: its estimate
    (68.9 + 3 GB fixed) is over 90 % of the H100's 79.18 GiB, so the estimate alone leaves it out;
    with --db the measurement, which with the fit's 7 GB headroom fits, lists it and the row carries
    it. Likewise with a wider margin (15 %). The measurement was taken without CUDA graphs, which the
    search would add (their pools fitting with moe_act and layernorm recomputed): the plan is asked
    for none."""
    from moetune.estimate.memory import plan
    from moetune.paths import ROOT
    db = str(ROOT / "benchmarks" / "one_gpu_tuning" / "moetune.db")
    argv = ["plan", "qwen3_235b", "--gpus", "256", "--gpu-type", "H100", "--format", "json", "--limit", "5000",
            "--cuda-graphs", "none"]
    def layout(r):  # without virtual stages or CP, at micro batch 1, as measured
        c = r["config"]
        measured = c["vpp"] is None and c["cp"] == 1 and c["micro_batch"] == 1
        return (c["tp"], c["pp"], c["ep"], tuple(c["recompute_modules"])) if measured else None
    _, alone = _json(capsys, argv)
    assert alone and not any(layout(r) == (2, 2, 128, ()) for r in alone)
    _, rows = _json(capsys, ["--db", db] + argv)
    row = next(r for r in rows if layout(r) == (2, 2, 128, ()))
    assert row["measured_gb"] == pytest.approx(68.91, abs=0.01)
    assert row["estimate_gb"] == pytest.approx(68.91, rel=0.02)
    assert row["memory_gb"] > 0.9 * GPUS["H100"].memory_gb  # listed for its measurement alone
    exp = load_experiment("qwen3_235b")
    def key(c):
        return (c.tp, c.pp, c.ep, c.vpp, tuple(c.recompute_modules))

    def kinds(measured=None):
        return {key(lay.config) for lay in plan(exp, 256, "H100", limit=1000, headroom_share=0.15, measured=measured)}
    target = (2, 2, 128, None, ())
    assert target not in kinds()  # the estimate alone, with the wider margin
    assert target in kinds(lambda c: 68.91 if key(c) == target else None)
    assert (2, 2, 128, None, ("moe_act", "layernorm")) in kinds()  # recompute only where needed


def test_plan_lists_the_baseline_where_it_fits(capsys, no_store):
    """deepseek_v3 on its own 1024 H100s: the search's grid does not hold the baseline's layout
    (PP 16 with its recompute), which fits; it is listed first, marked, in text and JSON alike."""
    capsys.readouterr()
    assert main(["plan", "deepseek_v3", "--order", "memory"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.endswith("baseline"))
    assert row.split()[:5] == ["2", "1", "16", "-", "64"]  # TP, CP, PP, VPP, EP
    rc, rows = _json(capsys, ["plan", "deepseek_v3", "--order", "memory", "--format", "json"])
    assert rc == 0 and {k: rows[0]["config"][k] for k in ("tp", "pp", "ep")} == {"tp": 2, "pp": 16, "ep": 64}


def test_baseline_on_too_few_gpus_is_one_line(capsys, no_store):
    """A baseline whose parallel groups need more GPUs than given: one line naming how many, exit 1
    (it does not fit), in both formats; no division by zero."""
    for argv in (["plan", "deepseek_v3", "--gpus", "256", "--gpu-type", "H100", "--baseline"],
                 ["plan", "qwen3_235b", "--gpus", "8", "--baseline"],
                 ["plan", "qwen3_235b", "--gpus", "8", "--baseline", "--format", "json"]):
        capsys.readouterr()
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "baseline needs" in err[0] and "GPUs" in err[0], err


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_a_limit_below_one_is_a_usage_error(capsys, no_store, limit):
    """--limit 0 or -1 is refused by argparse (exit 2, saying give 1 or more), not "no layout fits"."""
    assert main(["plan", "moe_proxy", "--limit", limit]) == 2
    out = capsys.readouterr()
    assert "--limit" in out.err and "give 1 or more" in out.err and "fits" not in out.out + out.err


def test_an_unknown_dispatcher_names_itself(capsys, tmp_path, no_store):
    """`dispatcher: nccl` in the baseline: one line naming the dispatchers allowed, exit 2."""
    assert main(["plan", proxy_variant(tmp_path, "dispatcher: alltoall", "dispatcher: nccl")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1, out.err
    assert out.err.startswith("moetune plan: ") and "dispatcher must be one of alltoall, allgather, flex" in out.err


def test_a_global_batch_no_layout_divides_names_it(capsys, tmp_path, no_store):
    """A global batch of 15 with micro batch 2: every layout is refused by the batch, and plan says
    so (with a batch that would divide) instead of "no layout fits; add GPUs"."""
    # the micro batch kept at the baseline's (the search tries 1 too, which 15 takes)
    assert main(["plan", proxy_variant(tmp_path, "global_batch: 16", "global_batch: 15"), "--micro-batch", "2"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1, out.err
    assert "global_batch_not_divisible" in out.err and "global batch 15" in out.err and "add GPUs" not in out.err


def test_more_gpus_than_the_global_batch_can_feed_names_the_batch(capsys, no_store):
    """10 million GPUs: the global batch bounds every layout, and plan names it and the most GPUs it
    can feed (one line, exit 2) instead of "no layout fits; add GPUs"."""
    assert main(["plan", "qwen3_30b_a3b", "--gpus", "10000000"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1, out.err
    assert out.err.startswith("moetune plan: no layout of qwen3_30b_a3b on 10000000 GPUs can run: ")
    assert "global_batch 1024 with micro batch 1 feeds at most 1024 data-parallel ranks, 524288 GPUs" in out.err
    assert "add GPUs" not in out.err


def test_plan_describes_its_default_order(capsys):
    """`plan --help` says what the default order is: the fastest predicted first."""
    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "fastest predicted first" in text and "memory fits, least model parallelism first" not in text


def test_plan_with_fsdp_keeps_it_in_every_layout(capsys, no_store):
    """`plan --fsdp` lists only FSDP layouts, each estimated as FSDP (its weights sharded: less than
    the same layout's under the distributed optimizer), and says so on each row."""
    argv = ["plan", "qwen3_235b", "--gpus", "256", "--fsdp", "--recompute", "full", "--micro-batch", "4",
            "--global-batch", "8192", "--limit", "3"]
    capsys.readouterr()
    assert main(argv + ["--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["layouts"]
    assert rows and all(r["config"]["fsdp"] for r in rows)
    assert all(r["breakdown"]["weights_gb"] < 20 for r in rows)  # 470 GB of bf16 weights over 256 GPUs
    assert main(argv) == 0
    assert "FSDP optim_grads_params" in capsys.readouterr().out


def test_plan_with_fsdp_searches_each_layout_once(capsys, no_store):
    """`plan --fsdp` searches the FSDP grid (PP 1, where FSDP stands in for a pipeline) once: no two
    rows alike (the distributed optimizer's grid points turned FSDP by the flag doubled every row);
    with `--pp 2` or `--vpp 2` too, FSDP beside a pipeline is searched, not nothing."""
    def shown(*flags):
        assert main(["plan", "qwen3_235b", "--fsdp", "--format", "json", "--limit", "20", *flags]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["search"], [json.dumps(r["config"], sort_keys=True) for r in out["layouts"]]
    capsys.readouterr()
    _, rows = shown()
    assert len(rows) == 20 and len(set(rows)) == len(rows)
    assert all(json.loads(r)["fsdp"] and json.loads(r)["pp"] == 1 for r in rows)
    counts2, rows2 = shown("--pp", "2")
    assert counts2["considered"] > 0 and rows2 and all(json.loads(r)["pp"] == 2 for r in rows2)
    assert len(set(rows2)) == len(rows2)
    counts3, rows3 = shown("--vpp", "2")  # virtual stages ask for a pipeline too
    assert counts3["considered"] > 0 and all(json.loads(r)["pp"] > 1 and json.loads(r)["vpp"] == 2 for r in rows3)

"""`moetune predict` (cli/predict.py): a recorded fit's measured compute replacing the analytic one,
every shipped experiment predicted in text and JSON without a GPU, bad flags as one line, and
`moetune plan` ranking its layouts fastest first. The model's modules have their own files
(tests/test_predict_{comm,flops,rates,step}.py)."""
import json

import pytest

from moetune.cli.main import main
from moetune.paths import ROOT
from moetune.experiment.schema import list_experiments
from tests.conftest import proxy_variant
ONE_GPU_DB = str(ROOT / "benchmarks" / "one_gpu_tuning" / "moetune.db")


def _json(capsys, argv):
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_a_fit_replaces_the_analytic_compute(capsys, no_store):
    """The recorded one-GPU study of qwen3_30b_a3b on an H100 (benchmarks/one_gpu_tuning) measured
    its baseline layout: one-GPU trial 1 judged 2544.1 ms for 4 micro-batches, its fit 1287.4 ms
    for 2; the faster per micro-batch (636.0 ms) is the compute of each of the step's 64."""
    argv = ["predict", "qwen3_30b_a3b", "--format", "json"]
    fitted = _json(capsys, ["--db", ONE_GPU_DB] + argv + ["--compute", "fit"])
    analytic = _json(capsys, ["--db", ONE_GPU_DB] + argv + ["--compute", "analytic"])
    assert fitted["compute_source"] == "fit" and analytic["compute_source"] == "analytic"
    assert fitted["terms"]["compute"] == pytest.approx(64 * 2544.1 / 4, rel=1e-4)
    assert "one-GPU trial 1" in fitted["inputs"]["measured_compute"]
    assert analytic["terms"]["compute"] != pytest.approx(fitted["terms"]["compute"], rel=0.05)
    assert fitted["terms"]["ep_a2a"] == analytic["terms"]["ep_a2a"]  # only compute changes
    # no store: --compute fit is one line, exit 2
    capsys.readouterr()
    assert main(argv + ["--compute", "fit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no fit or one-GPU trial" in err[0]


@pytest.mark.parametrize("name", list_experiments())
def test_every_experiment_predicts_in_text_and_json(capsys, no_store, name):
    """Analytic compute, no GPU, no store: the JSON has its keys and terms that add up; the text
    is a table of the same terms."""
    d = _json(capsys, ["predict", name, "--format", "json"])
    for key in ("step_time_ms", "tokens_per_s_per_gpu", "terms", "compute_source", "assumptions"):
        assert key in d
    assert d["compute_source"] == "analytic" and d["step_time_ms"] > 0 and d["tokens_per_s_per_gpu"] > 0
    assert sum(d["terms"].values()) == pytest.approx(d["step_time_ms"], rel=1e-3)
    assert any("balanced" in a for a in d["assumptions"])
    assert main(["predict", name]) == 0
    out = capsys.readouterr().out
    assert all(term in out for term in d["terms"]) and "tokens/s/GPU" in out


def test_bad_flags_are_one_line(capsys, no_store):
    for argv in (["predict", "qwen3_30b_a3b", "--recompute", "attn"],
                 ["predict", "qwen3_30b_a3b", "--ep", "7"],
                 ["predict", "qwen3_30b_a3b", "--vpp", "2"],
                 ["predict", "qwen3_30b_a3b", "--dispatcher", "nccl"],
                 ["predict", "no_such_model"]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        # the one line that says what is wrong (argparse's usage block before it, where it is argparse's)
        err = [l for l in capsys.readouterr().err.strip().splitlines() if l.startswith("moetune predict:")]
        assert len(err) == 1, (argv, err)


def test_plan_ranks_the_predicted_fastest_first(capsys, no_store):
    """qwen3_30b_a3b on 16 H100: plan's rows come fastest first, VPP pipelines among them, and the
    first row's figure is what `moetune predict` gives for its layout; --order memory keeps the
    old order (least model parallelism first)."""
    rows = _json(capsys, ["plan", "qwen3_30b_a3b", "--format", "json", "--limit", "50"])["layouts"]
    speeds = [r["predicted"]["tokens_per_s_per_gpu"] for r in rows]
    assert speeds == sorted(speeds, reverse=True) and any(r["config"]["vpp"] for r in rows)
    top = rows[0]["config"]
    flags = [f"--{k.replace('_', '-')}={top[k]}" for k in ("tp", "pp", "ep", "micro_batch")]
    flags += [f"--vpp={top['vpp']}"] if top["vpp"] else []
    flags += [f"--recompute={','.join(top['recompute_modules'])}"] if top["recompute_modules"] else []
    # the settings the search chose for it
    flags += [f"--cp={top['cp']}", f"--dispatcher={top['flex_backend'] or top['dispatcher']}"]
    flags += [f"--cuda-graphs={','.join(top['cuda_graph_modules']) or 'none'}"]
    flags += [f for f, on in (("--ep-overlap", top["overlap_ep_a2a"]), ("--delay-wgrad", top["delay_wgrad"]),
                              ("--tp-comm-overlap", top["tp_comm_overlap"])) if on]
    d = _json(capsys, ["predict", "qwen3_30b_a3b", "--format", "json"] + flags)
    # plan rounds to whole tokens and 0.1 ms, predict's JSON to 0.1 token: compare within that
    assert d["tokens_per_s_per_gpu"] == pytest.approx(speeds[0], abs=1)
    assert d["step_time_ms"] == pytest.approx(rows[0]["predicted"]["step_time_ms"], abs=0.05)
    old = _json(capsys, ["plan", "qwen3_30b_a3b", "--format", "json", "--order", "memory"])["layouts"]
    mp = [r["tp_pp"] for r in old]
    assert mp == sorted(mp) and all("predicted" not in r for r in old)


def test_plan_reads_the_store_once_however_many_layouts_it_prices(capsys, no_store, monkeypatch):
    """`moetune plan` over the recorded one-GPU study's store prices every fitting layout with one
    opening of the store and one pass over its trials (StoreReadings), not one per layout."""
    from moetune.estimate import readings
    opened, passes = [], []
    real_init, real_reads = readings.Store.__init__, readings.StoreReadings._measurements

    def counting_init(self, *a, **k):
        opened.append(1)
        real_init(self, *a, **k)

    def counting_reads(self):
        if self._compute is None:
            passes.append(1)
        return real_reads(self)
    monkeypatch.setattr(readings.Store, "__init__", counting_init)
    monkeypatch.setattr(readings.StoreReadings, "_measurements", counting_reads)
    out = _json(capsys, ["--db", ONE_GPU_DB, "plan", "qwen3_30b_a3b", "--format", "json"])["layouts"]
    priced = [l for l in out if l.get("predicted")]
    assert len(priced) > 1
    assert (len(opened), len(passes)) == (1, 1)


def test_an_unknown_dispatcher_is_refused_not_priced_as_alltoall(capsys, tmp_path, no_store):
    """`dispatcher: nccl` in the baseline: predict refuses it in one line listing the valid ones,
    exit 2, instead of pricing an all-to-all."""
    assert main(["predict", proxy_variant(tmp_path, "dispatcher: alltoall", "dispatcher: nccl")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1, out.err
    assert out.err.startswith("moetune predict: ") and "variant.yaml: baseline: " in out.err
    assert "dispatcher must be one of alltoall, allgather, flex" in out.err


def test_gpus_on_a_cluster_without_gpus_is_one_line(capsys, tmp_path, no_store):
    """--gpus on an experiment whose cluster.gpus_per_node is 0: one line naming the key, exit 2."""
    exp = proxy_variant(tmp_path, "gpus_per_node: 2", "gpus_per_node: 0")
    assert main(["predict", exp, "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "cluster.gpus_per_node is 0" in err and "Traceback" not in err


def test_a_changed_pp_does_not_inherit_the_baselines_uneven_split(capsys, no_store):
    """deepseek_v3's baseline splits 61 layers over PP 16 as first 3, last 2: `--pp 8` says so and
    prices the split Megatron takes at PP 8 (6 and 7 at the ends, 8 a middle stage), not the PP-16
    one; the split flags set it outright, and one Megatron refuses is the rule's one line, exit 2."""
    capsys.readouterr()
    assert main(["predict", "deepseek_v3", "--pp", "8", "--format", "json"]) == 0
    out = capsys.readouterr()
    d = json.loads(out.out)
    assert (d["config"]["first_pp_layers"], d["config"]["last_pp_layers"]) == (6, 7)
    assert "(first 3, last 2 layers) is for PP16; recomputed: first 6, last 7 layers" in out.err
    work = d["inputs"]["slowest_stage_work"]
    assert work["layers"] <= 8  # no stage holds more than a middle stage's 8 (+ the MTP layer on the last)
    layout = _json(capsys, ["predict", "deepseek_v3", "--pp", "8", "--pp-layout", "Et*3|(tt|)*29m|L", "--format",
                            "json"])
    assert layout["config"]["vpp"] == 4 and layout["config"]["first_pp_layers"] is None
    capsys.readouterr()
    assert main(["predict", "deepseek_v3", "--pp", "8", "--first-pp-layers", "3", "--last-pp-layers", "2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "layers_not_divisible_by_pp: the 56 middle layers must split evenly over 6 middle stages" in line


def test_a_pp_and_vpp_no_split_reaches_get_a_layout_string(capsys, no_store):
    """deepseek_v3 at `--pp 8 --vpp 4`: 61 layers over 32 virtual stages take no first/last or
    accounted split; predict prices DeepSeek's layout string for it (as plan's search builds it)."""
    capsys.readouterr()
    assert main(["predict", "deepseek_v3", "--pp", "8", "--vpp", "4", "--format", "json"]) == 0
    out = capsys.readouterr()
    d = json.loads(out.out)
    assert d["config"]["pp_layout"] == "Et|(tt|)*30mL" and d["config"]["vpp"] == 4
    assert "recomputed: layout Et|(tt|)*30mL" in out.err


def test_vpp_1_means_no_virtual_stages(capsys, no_store):
    """qwen3_235b's baseline has VPP 4: `--vpp 1` prices it without virtual stages (and so without
    the embedding and loss split that VPP 4 needed, recomputed for PP 8 alone)."""
    d = _json(capsys, ["predict", "qwen3_235b", "--vpp", "1", "--format", "json"])
    assert d["config"]["vpp"] is None
    assert (d["config"]["first_pp_layers"], d["config"]["last_pp_layers"]) == (11, 11)


def test_predict_says_what_the_virtual_stages_cost_the_host(capsys, no_store):
    """At VPP 4 the host's time a micro-batch shows the schedule's 6 passes beyond one stage's, at
    the rate table's time a pass; without virtual stages there is no such line."""
    from moetune.estimate import Rates
    assert main(["predict", "qwen3_235b"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "virtual stages" in x)
    assert f"{6 * Rates()['host_ms_per_virtual_stage_pass']:.1f} of it the schedule's passes through 4" in line
    assert main(["predict", "qwen3_235b", "--vpp", "1"]) == 0
    assert "virtual stages" not in capsys.readouterr().out


def test_predict_and_plan_show_the_band_and_the_rows_that_dominate_it(capsys, no_store):
    """predict: the step with its low-high band on the first line and the dominant rows (text),
    the band with every row's ends and moves (JSON); plan: each shown layout's band and rows. A
    fitted compute leaves the compute rows out of the band (the measurement replaces them)."""
    d = _json(capsys, ["predict", "qwen3_235b", "--format", "json"])
    b = d["band"]
    assert b["low_ms"] < d["step_time_ms"] < b["high_ms"] and len(b["dominant"]) == 3
    assert set(b["dominant"]) <= set(b["rows"]) and all(r["kind"] for r in b["rows"].values())
    assert main(["predict", "qwen3_235b"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"({b['low_ms']:.0f}-{b['high_ms']:.0f}) ms a step" in out[0]
    band_line = next(line for line in out if line.strip().startswith("band "))
    assert all(name in band_line for name in b["dominant"])
    rows = _json(capsys, ["plan", "qwen3_235b", "--limit", "3", "--format", "json"])["layouts"]
    for r in rows:
        p = r["predicted"]
        assert p["step_time_low_ms"] < p["step_time_ms"] < p["step_time_high_ms"] and len(p["band_rows"]) == 3
    fitted = _json(capsys, ["--db", ONE_GPU_DB, "predict", "qwen3_30b_a3b", "--format", "json", "--compute", "fit"])
    assert "kernel_table_rate" not in fitted["band"]["rows"]


NVIDIA_FSDP = ["predict", "qwen3_235b", "--gpus", "256", "--tp", "1", "--pp", "1", "--ep", "8", "--fsdp",
               "--micro-batch", "4", "--recompute", "full", "--global-batch", "8192"]


def test_predict_prices_nvidias_fsdp_layout_and_shows_its_collectives(capsys, no_store):
    """qwen3_235b at NVIDIA's FSDP layout (TP1 PP1 EP8, micro batch 4, full recompute): TP1 drops the
    baseline's sequence parallelism and PP1 its virtual stages; the JSON's dp_sync holds FSDP's
    per-micro-batch gathers and reduces, the DP terms their exposed part, and the text says so; an
    unknown strategy is argparse's refusal, exit 2."""
    d = _json(capsys, NVIDIA_FSDP + ["--format", "json"])
    c, sync = d["config"], d["inputs"]["dp_sync"]
    assert c["fsdp"] and not c["sequence_parallel"] and c["vpp"] is None and c["fsdp_sharding"] == "optim_grads_params"
    assert sync["strategy"] == "optim_grads_params" and (sync["dp"], sync["edp"]) == (256, 32)
    mb = d["inputs"]["micro_batches"]
    assert mb == 8 and d["terms"]["dp_param_gather"] == pytest.approx(
        mb * sync["exposed_gather_ms_per_micro_batch"], abs=1e-2)
    assert main(NVIDIA_FSDP) == 0
    text = capsys.readouterr().out
    assert "Megatron FSDP optim_grads_params over DP 256 / EDP 32" in text and "exposed" in text
    og = _json(capsys, NVIDIA_FSDP + ["--fsdp-sharding", "optim_grads", "--format", "json"])
    assert og["config"]["fsdp_sharding"] == "optim_grads" and og["inputs"]["dp_sync"]["forward_gather_ms"] == 0
    capsys.readouterr()
    assert main(NVIDIA_FSDP + ["--fsdp-sharding", "everything"]) == 2
    assert "--fsdp-sharding: invalid choice" in capsys.readouterr().err


def test_the_settings_flags_price_what_they_set(capsys, no_store):
    """--cuda-graphs takes scopes (fewer host launches than none) or refuses an unknown one in one
    line; --tp-comm-overlap at TP 1 is refused by the constraint table's rule, exit 2."""
    base = ["predict", "qwen3_30b_a3b", "--format", "json"]
    off = _json(capsys, base + ["--cuda-graphs", "none"])
    graphed = _json(capsys, base + ["--cuda-graphs", "attn,moe_router,moe_preprocess"])
    assert graphed["terms"]["host_launch"] < off["terms"]["host_launch"]
    assert graphed["terms"]["compute"] == off["terms"]["compute"]
    capsys.readouterr()
    assert main(base + ["--cuda-graphs", "attn,bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bogus unknown" in err[0]
    assert main(base + ["--tp-comm-overlap"]) == 2
    assert "tp_comm_overlap_needs_sp" in capsys.readouterr().err


def test_no_p2p_overlap_counts_the_interleaved_pipelines_sends(capsys, no_store):
    """qwen3_235b's baseline (PP 8, VPP 4): its sends hide behind compute as Megatron runs them by
    default; --no-p2p-overlap counts them in every micro-batch, and plan keeps the setting in every
    layout it lists."""
    base = ["predict", "qwen3_235b", "--format", "json"]
    on = _json(capsys, base)
    off = _json(capsys, base + ["--no-p2p-overlap"])
    assert on["config"]["overlap_p2p_comm"] and not off["config"]["overlap_p2p_comm"]
    assert on["terms"]["pp_sends"] == 0 < off["terms"]["pp_sends"]
    plan = _json(capsys, ["plan", "qwen3_235b", "--no-p2p-overlap", "--limit", "3", "--format", "json"])
    rows = plan["layouts"] if "layouts" in plan else plan
    assert rows and all(not r["config"]["overlap_p2p_comm"] for r in rows)


def test_a_nic_bound_layout_says_so(capsys, no_store):
    """DeepSeek-V3 under Megatron FSDP without a pipeline: its gathers and reduce and its all-to-all's
    share across nodes outlast its compute together; predict's text names the NIC as the pace and
    its JSON carries the NIC's time; NVIDIA's pipeline layout is not NIC-bound."""
    fsdp = ["predict", "deepseek_v3", "--tp", "4", "--pp", "1", "--ep", "128", "--micro-batch", "2", "--fsdp",
            "--dispatcher", "deepep", "--ep-overlap"]
    capsys.readouterr()
    assert main(fsdp) == 0
    assert "NIC-bound" in capsys.readouterr().out
    p = _json(capsys, fsdp + ["--format", "json"])
    assert p["inputs"]["nic_ms_per_micro_batch"] == pytest.approx(max(p["inputs"]["stage_micro_batch_ms"].values()))
    assert main(["predict", "deepseek_v3"]) == 0
    assert "NIC-bound" not in capsys.readouterr().out


def test_plan_counts_the_layouts_inside_the_firsts_band(capsys, no_store):
    """plan's last line counts the shown layouts whose predicted step lies inside the first's band,
    the ones the model does not order: the same count the JSON's rows give."""
    rows = _json(capsys, ["plan", "qwen3_235b", "--limit", "8", "--format", "json"])["layouts"]
    first = rows[0]["predicted"]
    lo, hi = first["step_time_low_ms"], first["step_time_high_ms"]
    inside = sum(lo <= r["predicted"]["step_time_ms"] <= hi for r in rows)
    assert main(["plan", "qwen3_235b", "--limit", "8"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"{inside} of the 8 shown lie inside the first's band ({lo:.0f}-{hi:.0f} ms)")
    assert 1 <= inside <= 8


def test_predict_says_the_layouts_memory_and_whether_graphs_pools_fit(capsys, no_store):
    """predict shows the estimate a GPU with the CUDA graphs' pools apart: Qwen3-235B's NVIDIA layout
    fits without graphs and with the router's and preprocess's, not with attention's (its pools hold
    each layer's attention tensors for every micro-batch in flight); text says so in one line."""
    base = ["predict", "qwen3_235b", "--format", "json"]
    off = _json(capsys, base + ["--cuda-graphs", "none"])["memory"]
    rp = _json(capsys, base + ["--cuda-graphs", "moe_router,moe_preprocess"])["memory"]
    arp = _json(capsys, base + ["--cuda-graphs", "attn,moe_router,moe_preprocess"])["memory"]
    assert off["cuda_graphs_gb"] == 0 < rp["cuda_graphs_gb"] < arp["cuda_graphs_gb"]
    assert off["fits"] and rp["fits"] and not arp["fits"]
    assert rp["total_gb"] - off["total_gb"] == pytest.approx(rp["cuda_graphs_gb"], abs=0.002)
    capsys.readouterr()
    assert main(["predict", "qwen3_235b", "--cuda-graphs", "attn,moe_router,moe_preprocess"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("memory:")]
    assert len(line) == 1 and "CUDA graphs' pools" in line[0] and "does not fit" in line[0]

"""The step-time model (spec/predict) and `moetune predict`: each term against a hand computation
on a small made-up model, EP peers inside and across the NVLink domain priced by the rate table, a
recorded fit's measured compute replacing the analytic one, every shipped experiment predicted in
text and JSON without a GPU, and `moetune plan` ranking its layouts fastest first."""
import json

import pytest

from moetune.pipeline.cli.main import main
from moetune.pipeline.paths import ROOT
from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.spec.experiment import list_experiments
from moetune.pipeline.spec.model import ModelArch
from moetune.pipeline.spec.predict import Node, Rates, bubble_fraction, predict
from moetune.pipeline.spec.predict import comm

TOY = ModelArch(name="toy", num_layers=8, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                ffn_hidden_size=4096, moe_ffn_hidden_size=512, num_experts=8, moe_router_topk=2,
                vocab_size=32000, seq_length=1024)
H100_NVLINK, NIC = 450e9, 48.5e9  # spec/gpus.py, rates.py nic_gb_s
ONE_GPU_DB = str(ROOT / "benchmarks" / "one_gpu_tuning" / "moetune.db")


@pytest.fixture
def no_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOETUNE_DB", raising=False)


def _json(capsys, argv):
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_a2a_volume_of_a_small_model():
    """A rank sends its tokens x top-k x hidden x 2 B each way: 2048 tokens (micro batch 2 of 1024)
    x 2 x 1024 x 2 B = 8 MiB; with EP 4 inside one 8-GPU domain, 3/4 of it goes over NVLink at
    the all-to-all row's share; dispatch and combine forward and backward make four transfers."""
    c = TrainingConfig(ep=4, micro_batch=2)
    r = comm.a2a(TOY, c, "H100", 8, Rates())
    assert r["bytes_sent"] == 2048 * 2 * 1024 * 2 == 8 * 2**20
    assert (r["share_in_nvlink"], r["share_across"]) == (0.75, 0.0)
    one = 8 * 2**20 * 0.75 / (H100_NVLINK * 0.5) * 1e3
    assert r["dispatch_ms"] == pytest.approx(one) and r["ms"] == pytest.approx(4 * one)


def test_ep_peers_across_the_nvlink_domain_cost_what_the_nic_rows_say():
    """EP 4 with 2-GPU NVLink domains: one peer inside (1/4 of the tokens), two across (1/2),
    the NIC's share setting the pace; DeepEP's rows price the same traffic lower than NCCL's."""
    c = TrainingConfig(ep=4, micro_batch=2)
    inside = comm.a2a(TOY, c, "H100", 8, Rates())
    across = comm.a2a(TOY, c, "H100", 2, Rates())
    sent = 8 * 2**20
    assert (across["share_in_nvlink"], across["share_across"]) == (0.25, 0.5)
    want = max(sent * 0.25 / (H100_NVLINK * 0.5), sent * 0.5 / (NIC * 0.75)) * 1e3
    assert across["dispatch_ms"] == pytest.approx(want) and across["ms"] > 4 * inside["ms"]
    deepep = comm.a2a(TOY, c.replace(dispatcher="flex", flex_backend="deepep"), "H100", 2, Rates())
    assert deepep["dispatch_ms"] == pytest.approx(sent * 0.5 / (NIC * 51 / 50) * 1e3)
    # a measured row replaces the published one by name
    slow = comm.a2a(TOY, c, "H100", 2, Rates(measured={"alltoall_rdma": (0.25, "test")}))
    assert slow["dispatch_ms"] == pytest.approx(3 * across["dispatch_ms"])


def test_bubble_fraction_and_term():
    """PP 4, VPP 2, 8 micro-batches: fill and drain are (4-1)/(2x8) = 3/16 of the steady part, and
    the step's bubble term is (PP-1)/VPP of the slowest stage's micro-batch time."""
    c = TrainingConfig(pp=4, vpp=2, micro_batch=1, global_batch=16)
    assert bubble_fraction(c, 8) == 3 / 16
    p = predict(TOY, c, Node("H100", 8, 8, 28), world=8)
    assert p.inputs["micro_batches"] == 8 and p.inputs["bubble_fraction"] == 3 / 16
    slowest = max(p.inputs["stage_micro_batch_ms"].values())
    assert p.terms["pipeline_bubble"] == pytest.approx(1.5 * slowest)
    assert p.step_time_ms == pytest.approx(sum(p.terms.values()))


def test_dp_reduce_bytes():
    """Distributed optimizer, 1e9 dense parameters over 16 data-parallel ranks on two nodes: a
    reduce-scatter of 4 GB of fp32 gradients, 15/16 of it through the NIC, then an all-gather of
    the 2 GB of bf16 weights; without the distributed optimizer an all-reduce, twice the reduce."""
    c = TrainingConfig(distributed_optimizer=True)
    r = comm.dp_sync(1e9, 0.0, c, 16, "H100", 8, Rates())
    assert r["grad_bytes"] == 4e9 and r["link"] == "nic"
    assert r["reduce_ms"] == pytest.approx(4e9 * 15 / 16 / NIC * 1e3)
    assert r["gather_ms"] == pytest.approx(r["reduce_ms"] / 2)
    plain = comm.dp_sync(1e9, 0.0, c.replace(distributed_optimizer=False), 16, "H100", 8, Rates())
    assert plain["reduce_ms"] == pytest.approx(2 * r["reduce_ms"]) and plain["gather_ms"] == 0


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
    rows = _json(capsys, ["plan", "qwen3_30b_a3b", "--format", "json", "--limit", "50"])
    speeds = [r["predicted"]["tokens_per_s_per_gpu"] for r in rows]
    assert speeds == sorted(speeds, reverse=True) and any(r["config"]["vpp"] for r in rows)
    top = rows[0]["config"]
    flags = [f"--{k.replace('_', '-')}={top[k]}" for k in ("tp", "pp", "ep", "micro_batch")]
    flags += [f"--vpp={top['vpp']}"] if top["vpp"] else []
    flags += [f"--recompute={','.join(top['recompute_modules'])}"] if top["recompute_modules"] else []
    d = _json(capsys, ["predict", "qwen3_30b_a3b", "--format", "json"] + flags)
    assert round(d["tokens_per_s_per_gpu"]) == speeds[0]
    old = _json(capsys, ["plan", "qwen3_30b_a3b", "--format", "json", "--order", "memory"])
    mp = [r["model_parallel"] for r in old]
    assert mp == sorted(mp) and all("predicted" not in r for r in old)

"""The rule engine, table-driven: each wall with representative metrics picks the expected rule;
preconditions and the constraint checker block the rules they must."""
from types import SimpleNamespace

import pytest

from moetune.decide import rules
from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch
from moetune.experiment.schema import Cluster, Tuning

MODEL = ModelArch(name="m", num_layers=8, hidden_size=2048, num_attention_heads=16,
                  num_query_groups=4, ffn_hidden_size=6144, moe_ffn_hidden_size=1536,
                  num_experts=16, moe_router_topk=4, vocab_size=32768, seq_length=2048)
MLA_MODEL = ModelArch(**{**MODEL.to_dict(), "multi_latent_attention": True, "kv_lora_rank": 512,
                         "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128})


def cluster(**kw):
    base = dict(name="c", nodes=1, gpus_per_node=8, gpu_type="H100", nvlink_domain=8,
                has_transformer_engine=True, has_deep_ep=True, has_hybrid_ep=False)
    return Cluster(**{**base, **kw})


def analysis(wall, evidence=(), **metrics):
    return {"wall": wall, "confidence": 0.8, "evidence": list(evidence),
            "metrics": {"combined": metrics}, "log": None, "gpu_memory_gb": 80}


def no_violations(config, model, cl):
    return []


TE = dict(transformer_impl="transformer_engine")
BASE = TrainingConfig(ep=8, micro_batch=1, global_batch=64, grouped_gemm=True, **TE)

# (case, analysis, config, cluster, model, expected first rule id)
CASES = [
    ("memory: cheap selective recompute first",
     analysis("memory", peak_memory_gb=79), BASE.replace(distributed_optimizer=True), cluster(), MODEL,
     "recompute_moe_act"),
    ("memory: distributed optimizer is free when DP > 1",
     analysis("memory"), BASE.replace(ep=4), cluster(), MODEL, "distributed_optimizer"),
    ("memory: without grouped GEMM and TE, the MoE layer recompute",
     analysis("memory"), TrainingConfig(ep=8, global_batch=64, transformer_impl="local", distributed_optimizer=True),
     cluster(has_transformer_engine=False), MODEL, "recompute_moe"),
    ("memory: MLA up-projection before mlp/moe",
     analysis("memory"), BASE.replace(recompute_granularity="selective", distributed_optimizer=True,
                                      recompute_modules=("moe_act", "layernorm", "core_attn")),
     cluster(), MLA_MODEL, "recompute_mla_up_proj"),
    ("communication: cross-node EP on H100 takes DeepEP",
     analysis("communication", exposed_a2a_share=0.3, comm_share=0.4),
     BASE.replace(ep=16), cluster(nodes=2), MODEL, "dispatcher_deepep"),
    ("communication: GB200 NVL72 takes HybridEP",
     analysis("communication", exposed_a2a_share=0.3, comm_share=0.4),
     BASE.replace(ep=16), cluster(nodes=4, gpus_per_node=4, gpu_type="GB200", nvlink_domain=72,
                                  has_hybrid_ep=True), MODEL, "dispatcher_hybridep_nvl"),
    ("communication: EP inside NVLink with allgather goes alltoall",
     analysis("communication", exposed_a2a_share=0.3, comm_share=0.4),
     BASE.replace(dispatcher="allgather"), cluster(), MODEL, "dispatcher_alltoall"),
    ("communication: EP inside one node overlaps the all-to-all",
     analysis("communication", exposed_a2a_share=0.2, comm_share=0.3),
     BASE, cluster(), MODEL, "ep_a2a_overlap"),
    ("communication: after the overlap, delayed wgrad",
     analysis("communication", exposed_a2a_share=0.1, comm_share=0.3),
     BASE.replace(overlap_ep_a2a=True), cluster(), MODEL, "delay_wgrad"),
    ("communication: DP collectives exposed",
     analysis("communication", exposed_a2a_share=0.0, exposed_other_comm_share=0.1, comm_share=0.1),
     BASE.replace(ep=4), cluster(), MODEL, "dp_overlap"),
    ("host overhead: larger micro batch while memory allows",
     analysis("host_overhead", gpu_idle_share=0.4, peak_memory_gb=20),
     BASE.replace(ep=8, global_batch=64), cluster(), MODEL, "larger_micro_batch"),
    ("host overhead: near memory, TE CUDA graphs",
     analysis("host_overhead", gpu_idle_share=0.4, peak_memory_gb=70),
     BASE, cluster(), MODEL, "cuda_graphs_te"),
    ("host overhead: drop-and-pad graphs the whole iteration",
     analysis("host_overhead", gpu_idle_share=0.4, peak_memory_gb=70),
     BASE.replace(capacity_factor=1.0, pad_to_capacity=True), cluster(), MODEL,
     "cuda_graphs_full_iteration"),
    ("compute: grouped GEMM first",
     analysis("compute", sm_util_estimate=0.9), BASE.replace(grouped_gemm=False), cluster(), MODEL,
     "grouped_gemm"),
    ("compute: FP8 blockwise on Hopper",
     analysis("compute", sm_util_estimate=0.9), BASE, cluster(), MODEL, "fp8_blockwise_hopper"),
    ("compute: MXFP8 on Blackwell",
     analysis("compute", sm_util_estimate=0.9), BASE, cluster(gpu_type="B200"), MODEL,
     "fp8_mxfp8_blackwell"),
]


@pytest.mark.parametrize("case,an,config,cl,model,expected", CASES, ids=[c[0] for c in CASES])
def test_wall_picks_expected_rule(case, an, config, cl, model, expected):
    """Each wall case proposes its expected rule first, with a changed config."""
    props = rules.proposals(an, config, model, cl, check=no_violations)
    assert props, case
    assert props[0].rule.id == expected
    assert props[0].config != config


def test_change_is_applied_to_config():
    """The DeepEP rule's change is applied to the config: flex dispatcher with the deepep backend,
    nothing else."""
    an = analysis("communication", exposed_a2a_share=0.3, comm_share=0.4)
    p = rules.proposals(an, BASE.replace(ep=16), MODEL, cluster(nodes=2), check=no_violations)[0]
    assert p.config.diff(BASE.replace(ep=16)) == {"dispatcher": ("flex", "alltoall"),
                                                  "flex_backend": ("deepep", None)}


# (case, analysis, config, cluster, rule that must NOT be proposed)
BLOCKED = [
    ("DeepEP needs the image to have it",
     analysis("communication", exposed_a2a_share=0.3), BASE.replace(ep=16),
     cluster(nodes=2, has_deep_ep=False), "dispatcher_deepep"),
    ("DeepEP is not for EP inside one node",
     analysis("communication", exposed_a2a_share=0.3), BASE, cluster(), "dispatcher_deepep"),
    ("EP overlap needs VPP when PP > 1",
     analysis("communication", exposed_a2a_share=0.3), BASE.replace(pp=2),
     cluster(nodes=2), "ep_a2a_overlap"),
    ("EP overlap needs shared-expert overlap off",
     analysis("communication", exposed_a2a_share=0.3), BASE.replace(shared_expert_overlap=True),
     cluster(), "ep_a2a_overlap"),
    ("EP overlap needs alltoall or flex",
     analysis("communication", exposed_a2a_share=0.3), BASE.replace(dispatcher="allgather"),
     cluster(), "ep_a2a_overlap"),
    ("EP overlap does not pair with full recompute",
     analysis("communication", exposed_a2a_share=0.3),
     BASE.replace(recompute_granularity="full", recompute_num_layers=1), cluster(), "ep_a2a_overlap"),
    ("exposed all-to-all below the rule's bar",
     analysis("communication", exposed_a2a_share=0.01), BASE, cluster(), "ep_a2a_overlap"),
    ("overlap cannot hide a rank waiting for a late peer",
     analysis("host_overhead", gpu_idle_share=0.5, exposed_a2a_share=0.32, a2a_wait_share=0.31),
     BASE, cluster(), "ep_a2a_overlap"),
    ("TE CUDA graphs are for dropless MoE only (partial scopes)",
     analysis("host_overhead", gpu_idle_share=0.4, peak_memory_gb=70),
     BASE.replace(capacity_factor=1.0), cluster(), "cuda_graphs_te"),
    ("no full-iteration graphs without drop-and-pad",
     analysis("host_overhead", gpu_idle_share=0.4, peak_memory_gb=70), BASE, cluster(),
     "cuda_graphs_full_iteration"),
    ("no larger micro batch near memory capacity",
     analysis("host_overhead", gpu_idle_share=0.4, peak_memory_gb=70), BASE, cluster(),
     "larger_micro_batch"),
    ("no FP8 without Transformer Engine",
     analysis("compute", sm_util_estimate=0.9), BASE.replace(transformer_impl="local"),
     cluster(has_transformer_engine=False), "fp8_blockwise_hopper"),
    ("token drop only where the study allows it",
     analysis("compute", sm_util_estimate=0.9), BASE, cluster(), "token_drop"),
    ("memory rules are not proposed unless memory fired",
     analysis("communication", exposed_a2a_share=0.3), BASE, cluster(), "full_recompute"),
]


@pytest.mark.parametrize("case,an,config,cl,rule_id", BLOCKED, ids=[c[0] for c in BLOCKED])
def test_preconditions_block(case, an, config, cl, rule_id):
    """A rule whose preconditions do not hold is not proposed."""
    ids = [p.rule.id for p in rules.proposals(an, config, MODEL, cl, check=no_violations)]
    assert rule_id not in ids, case


def test_full_recompute_is_the_last_memory_rule():
    """Under the memory wall, memory rules come first and full recompute is the last of them."""
    props = rules.proposals(analysis("memory"), BASE.replace(ep=4), MODEL, cluster(),
                            check=no_violations)
    ids = [p.rule.id for p in props if p.rule.wall == "memory"]
    assert ids[-1] == "full_recompute" and ids[0] != "full_recompute"
    assert props[len(ids) - 1].rule.id == "full_recompute"  # memory rules all come first


def test_token_drop_when_allowed():
    """Token drop is proposed when the experiment allows it."""
    ids = [p.rule.id for p in rules.proposals(analysis("compute", sm_util_estimate=0.9), BASE,
                                              MODEL, cluster(),
                                              tuning=Tuning(allow_token_drop=True),
                                              check=no_violations)]
    assert "token_drop" in ids


def test_other_fired_walls_follow_the_named_wall():
    """Rules of other walls that fired follow all the rules of the named wall."""
    an = analysis("host_overhead", gpu_idle_share=0.4, exposed_a2a_share=0.2, peak_memory_gb=70,
                  evidence=[{"wall": "host_overhead", "strength": 1.6},
                            {"wall": "communication", "strength": 1.2}])
    props = rules.proposals(an, BASE, MODEL, cluster(), check=no_violations)
    walls = [p.rule.wall for p in props]
    assert walls[0] == "host_overhead" and "communication" in walls
    assert walls.index("communication") > max(i for i, w in enumerate(walls) if w == "host_overhead")


def test_checker_refusal_is_kept_with_reason():
    """A proposal the checker refuses is kept, not ok, with the refusal code; others stay ok."""
    def refuse_flex(config, model, cl):
        if config.dispatcher == "flex":
            return [SimpleNamespace(code="flex_needs_te", message="flex needs TE",
                                    source="moe-dispatcher-selection.txt")]
        return []
    an = analysis("communication", exposed_a2a_share=0.3, comm_share=0.4)
    props = rules.proposals(an, BASE.replace(ep=16), MODEL, cluster(nodes=2), check=refuse_flex)
    deepep = next(p for p in props if p.rule.id == "dispatcher_deepep")
    assert not deepep.ok and "flex_needs_te" in deepep.refused[0]
    assert any(p.ok for p in props)


def test_real_constraint_checker_blocks_an_invalid_change():
    """The real constraint table refuses a rule's change to TP 3."""
    from moetune.experiment import constraints
    # TP=3 divides neither the 8 GPUs nor the 16 heads: the checker must refuse it
    bad = rules.Rule(id="tp3", wall="compute", change={"tp": 3}, priority=1, rationale="test",
                     source="moe-optimization-workflow.md")
    an = analysis("compute", sm_util_estimate=0.9)
    props = rules.proposals(an, BASE, MODEL, cluster(), rules=[bad], check=constraints.check)
    assert len(props) == 1 and not props[0].ok and props[0].refused


def test_bad_table_is_one_clear_error(tmp_path):
    """A rules table with an unknown field or wall is a RuleError naming it."""
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules:\n  - {id: x, wall: memory, change: {no_such_field: 1}, priority: 1, "
                   "rationale: r, source: s}\n")
    with pytest.raises(rules.RuleError, match="no_such_field"):
        rules.load_rules(bad)
    bad.write_text("rules:\n  - {id: x, wall: walls, change: {}, priority: 1, rationale: r, source: s}\n")
    with pytest.raises(rules.RuleError, match="wall"):
        rules.load_rules(bad)


def test_every_rule_cites_a_guidance_document():
    """Every rule cites a guidance document (one of the shared guidance files where they are present)."""
    import os
    docs = set(os.listdir("/work/shared/guidance")) if os.path.isdir("/work/shared/guidance") else None
    for r in rules.load_rules():
        assert r.source.endswith((".md", ".txt"))
        if docs:
            assert r.source in docs, r.id

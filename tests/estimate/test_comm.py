"""estimate/comm.py: what a rank sends through the expert all-to-all, TP and DP collectives
and over which link, against hand computations on a small made-up model."""
import pytest

from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch
from moetune.estimate import Rates
from moetune.estimate import comm

TOY = ModelArch(name="toy", num_layers=8, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                ffn_hidden_size=4096, moe_ffn_hidden_size=512, num_experts=8, moe_router_topk=2,
                vocab_size=32000, seq_length=1024)
H100_NVLINK, NIC = 450e9, 48.5e9  # experiment/gpus.py, rates.py nic_gb_s

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
    the NIC's share setting the pace; DeepEP's rows price the same traffic lower than NCCL's, and it
    sends a token across once per remote domain."""
    c = TrainingConfig(ep=4, micro_batch=2)
    inside = comm.a2a(TOY, c, "H100", 8, Rates())
    across = comm.a2a(TOY, c, "H100", 2, Rates())
    sent = 8 * 2**20
    assert (across["share_in_nvlink"], across["share_across"]) == (0.25, 0.5)
    want = max(sent * 0.25 / (H100_NVLINK * 0.5), sent * 0.5 / (NIC * 0.75)) * 1e3
    assert across["dispatch_ms"] == pytest.approx(want) and across["ms"] > 4 * inside["ms"]
    deepep = comm.a2a(TOY, c.replace(dispatcher="flex", flex_backend="deepep"), "H100", 2, Rates())
    # DeepEP sends a token once per remote domain: 2 domains of 4 experts each, top-2 of 8, so a
    # token reaches the other domain with probability 1 - C(4,2)/C(8,2) = 22/28, against the one
    # copy (2 x 1/2) an all-to-all sends across
    assert deepep["dispatch_ms"] == pytest.approx(sent * 0.5 * (22 / 28) / (NIC * 51 / 50) * 1e3)
    # a measured row replaces the published one by name
    slow = comm.a2a(TOY, c, "H100", 2, Rates(measured={"alltoall_rdma": (0.25, "test")}))
    assert slow["dispatch_ms"] == pytest.approx(3 * across["dispatch_ms"])


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


def test_fsdp_gathers_and_reduces_each_micro_batch():
    """Megatron FSDP, 1e9 dense and 2e9 expert parameters on 16 ranks over two nodes (EP 2: EDP 8):
    each micro-batch gathers the 2 B bf16 weights forward and backward and reduce-scatters the
    bf16 gradients, dense over 16 ranks and experts over 8, through the NIC; nothing is left for
    once a step. Under optim_grads only the reduce runs each micro-batch and the weights are
    gathered once a step; under optim the reduce waits for the step; under no_shard it is an
    all-reduce and nothing is gathered."""
    c = TrainingConfig(fsdp=True, ep=2, etp=1)
    r = comm.fsdp_sync(1e9, 2e9, c, 16, "H100", 8, Rates())
    one = (2e9 * 15 / 16 + 4e9 * 7 / 8) / NIC * 1e3
    assert r["link"] == "nic" and (r["dp"], r["edp"]) == (16, 8) and r["param_bytes"] == 6e9
    assert r["forward_gather_ms"] == r["backward_gather_ms"] == r["backward_reduce_ms"] == pytest.approx(one)
    assert r["step_reduce_ms"] == r["step_gather_ms"] == 0.0
    og = comm.fsdp_sync(1e9, 2e9, c.replace(fsdp_sharding="optim_grads"), 16, "H100", 8, Rates())
    assert (og["forward_gather_ms"], og["step_reduce_ms"]) == (0.0, 0.0)
    assert og["backward_reduce_ms"] == og["step_gather_ms"] == pytest.approx(one)
    optim = comm.fsdp_sync(1e9, 2e9, c.replace(fsdp_sharding="optim"), 16, "H100", 8, Rates())
    assert optim["backward_reduce_ms"] == 0.0
    assert optim["step_reduce_ms"] == optim["step_gather_ms"] == pytest.approx(one)
    whole = comm.fsdp_sync(1e9, 2e9, c.replace(fsdp_sharding="no_shard"), 16, "H100", 8, Rates())
    assert whole["step_reduce_ms"] == pytest.approx(2 * one) and whole["step_gather_ms"] == 0.0

def test_deepep_sends_a_token_once_per_remote_domain():
    """Qwen3-30B-A3B's routing (128 experts, top-8) at EP 16 over two 8-GPU domains: an all-to-all
    sends 8 x 8/16 = 4 copies of a token across, DeepEP one whenever any of its 8 experts is among
    the other domain's 64: 1 - C(64,8)/C(128,8) of the time, so the NIC carries a quarter of that."""
    from math import comb
    m = ModelArch(name="a3b", num_layers=48, hidden_size=2048, num_attention_heads=32, num_query_groups=4,
                  ffn_hidden_size=6144, moe_ffn_hidden_size=768, num_experts=128, moe_router_topk=8,
                  vocab_size=151936, seq_length=4096)
    c = TrainingConfig(ep=16, etp=1, micro_batch=1)
    hit = 1 - comb(64, 8) / comb(128, 8)
    assert comm.remote_domain_share(m, c, 8) == pytest.approx(hit / 4)
    nccl = comm.a2a(m, c, "H100", 8, Rates())
    deepep = comm.a2a(m, c.replace(dispatcher="flex", flex_backend="deepep"), "H100", 8, Rates())
    assert deepep["share_across"] == pytest.approx(nccl["share_across"] * hit / 4)
    # inside one domain nothing crosses, whatever the dispatcher
    assert comm.a2a(m, c.replace(ep=8), "H100", 8, Rates())["share_across"] == 0


def test_deepep_sends_a_token_once_per_peer_rank_inside_its_domain():
    """Qwen3-30B-A3B's routing at EP 4 on one host: alltoall sends 8 x 3/4 = 6 copies of a token to
    its 3 peers; DeepEP and HybridEP one to each peer holding any of its 8 experts, 3 x (1 - C(96,8)/
    C(128,8)) = 2.72, each at its own NVLink row."""
    from math import comb
    m = ModelArch(name="a3b", num_layers=16, hidden_size=2048, num_attention_heads=32, num_query_groups=4,
                  ffn_hidden_size=6144, moe_ffn_hidden_size=768, num_experts=128, moe_router_topk=8,
                  vocab_size=151936, seq_length=4096)
    c = TrainingConfig(ep=4, etp=1, micro_batch=4)
    hit = 1 - comb(96, 8) / comb(128, 8)
    assert comm.rank_dedup_share(m, c) == pytest.approx(4 * hit / 8)
    nccl = comm.a2a(m, c, "H200", 4, Rates())
    for backend, row in (("deepep", "deepep_nvlink_dispatch"), ("hybridep", "hybridep_nvlink")):
        flex = comm.a2a(m, c.replace(dispatcher="flex", flex_backend=backend), "H200", 4, Rates())
        assert flex["share_in_nvlink"] * 8 == pytest.approx(3 * hit) and nccl["share_in_nvlink"] * 8 == 6
        sent = flex["bytes_sent"] * flex["share_in_nvlink"]
        assert flex["dispatch_ms"] == pytest.approx(1e3 * sent / (H100_NVLINK * Rates()[row]))


def test_node_limited_routing_reaches_fewer_remote_domains():
    """DeepSeek-V3's routing (256 experts, top-8, 8 groups of which a token picks 4): at EP 64 over
    eight 8-GPU domains each domain holds one group, so a token reaches a given domain when it picks
    that group, 4 of 8: (8-1) x 1/2 domains a token against (8-1) x (1 - C(224,8)/C(256,8))
    routed uniformly; at EP 128 (two domains a group) a picked group's domain holds 16 of the 128
    candidate experts. Without groups the uniform figure is kept."""
    from dataclasses import replace
    from math import comb
    m = ModelArch(name="v3", num_layers=61, hidden_size=7168, num_attention_heads=128, num_query_groups=128,
                  ffn_hidden_size=18432, moe_ffn_hidden_size=2048, num_experts=256, moe_router_topk=8,
                  moe_router_num_groups=8, moe_router_group_topk=4, vocab_size=129280, seq_length=4096)
    uniform = replace(m, moe_router_num_groups=None, moe_router_group_topk=None)
    c = TrainingConfig(tp=2, ep=64, etp=1)
    copies = 8 * 56 / 64  # top-8 copies, 56 of 64 EP peers in other domains
    assert comm.remote_domain_share(m, c, 8) == pytest.approx(7 * 0.5 / copies)
    assert comm.remote_domain_share(uniform, c, 8) == pytest.approx(7 * (1 - comb(224, 8) / comb(256, 8)) / copies)
    assert comm.domain_hit(m, 16) == pytest.approx(4 / 8 * (1 - comb(128 - 16, 8) / comb(128, 8)))
    deepep = c.replace(dispatcher="flex", flex_backend="deepep")
    assert comm.a2a(m, deepep, "H100", 8, Rates())["ms"] < comm.a2a(uniform, deepep, "H100", 8, Rates())["ms"]


def test_the_allgather_dispatcher_gathers_every_token_over_the_ep_group():
    """allgather: each rank's 2048 tokens x 1024 x 2 B = 4 MiB gathered over EP 4 (a ring moves 3/4
    of the 16 MiB whole to each rank) inside one NVLink domain at the collective row's share, and
    reduce-scattered back; forward and backward, four rings. It moves tokens to every peer, not
    top-k copies, so it costs more than the all-to-all for this top-2 model at EP 4 over NVLink."""
    rates = Rates()
    c = TrainingConfig(ep=4, micro_batch=2, dispatcher="allgather")
    r = comm.a2a(TOY, c, "H100", 8, rates)
    one = 4 * 4 * 2**20 * 3 / 4 / (H100_NVLINK * rates["collective_nvlink"]) * 1e3
    assert r["dispatcher"] == "allgather" and r["dispatch_ms"] == pytest.approx(one)
    assert r["ms"] == pytest.approx(4 * one)
    assert comm.dispatcher_name(c) == "allgather" and r["link"] == "nvlink"


def test_context_parallel_passes_keys_and_values_around_its_ring():
    """CP 2: one step passes the rank's keys and values (1024 / 2 tokens x 8 groups x 128 x 2 x 2 B)
    to its peer forward, and backward passes them again with their gradients: three times, per
    layer; none without CP; a CP group wider than the NVLink domain goes over the NIC."""
    rates = Rates()
    assert comm.cp_exchange(TOY, TrainingConfig(), 4, "H100", 8, rates)["ms"] == 0.0
    r = comm.cp_exchange(TOY, TrainingConfig(cp=2), 4, "H100", 8, rates)
    nbytes = 512 * 8 * 128 * 2 * 2
    assert r["bytes"] == nbytes and r["link"] == "nvlink"
    assert r["ms"] == pytest.approx(3 * 4 * nbytes / (H100_NVLINK * rates["collective_nvlink"]) * 1e3)
    wide = comm.cp_exchange(TOY, TrainingConfig(cp=2, tp=8, sequence_parallel=True), 4, "H100", 8, rates)
    assert wide["link"] == "nic"


def test_recompute_that_reruns_the_moe_layer_runs_its_all_to_all_again():
    """Megatron's `moe` recompute checkpoints the MoE layer's forward, dispatch and combine included,
    as full recompute checkpoints the layer: the all-to-all runs three times a micro-batch, not two
    (its NIC share too); moe_act or layernorm recompute leaves it alone. Full recompute runs the
    forward's TP collectives again (3 of 2)."""
    r = Rates()
    c = TrainingConfig(micro_batch=2, ep=8, tp=2)
    a = comm.a2a(TOY, c, "H100", 8, r)
    for rc, passes in ((dict(recompute_granularity="selective", recompute_modules=("moe",)), 3),
                       (dict(recompute_granularity="full"), 3),
                       (dict(recompute_granularity="selective", recompute_modules=("moe_act", "layernorm")), 2)):
        b = comm.a2a(TOY, c.replace(**rc), "H100", 8, r)
        assert b["passes"] == passes and b["ms"] == pytest.approx(a["ms"] * passes / 2), rc
    tp = comm.tp_collectives(TOY, c, 8, 8, "H100", 8, r)
    full = comm.tp_collectives(TOY, c.replace(recompute_granularity="full"), 8, 8, "H100", 8, r)
    assert full["collectives"] == tp["collectives"] * 3 // 2 and full["ms"] == pytest.approx(tp["ms"] * 1.5)

"""What one rank sends, and how long it takes over the link its peers sit behind: the expert
all-to-all, tensor-parallel collectives, pipeline sends and the data-parallel gradient reduce and
parameter gather. Megatron orders ranks TP, CP, EP, DP, PP (experts: ETP, EP, EDP, PP), so a
group's peers are consecutive ranks `stride` apart and sit in one NVLink domain while
stride x size fits in it."""
from __future__ import annotations

import math

from moetune.estimate import fsdp
from moetune.estimate.flops import BF16, reruns_attention, reruns_moe_forward, tokens
from moetune.estimate.rates import Rates
from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch

GRAD_BYTES = 4  # fp32 main gradients, reduced as they are kept (estimate/memory.py counts the same)
PARAM_BYTES = 2  # bf16 weights, gathered after the distributed optimizer's step


def dispatcher_name(c: TrainingConfig) -> str:
    """alltoall | allgather | deepep | hybridep (the flex dispatcher by its backend)."""
    if c.dispatcher == "flex":
        return c.flex_backend or "deepep"
    return "allgather" if c.dispatcher == "allgather" else "alltoall"


# (dispatch over NVLink, combine over NVLink, dispatch over the NIC, combine over the NIC): rows of
# the rate table, each a share of the GPU's NVLink rate a direction or of the NIC's
A2A_ROWS = {
    "alltoall": ("alltoall_nvlink", "alltoall_nvlink", "alltoall_rdma", "alltoall_rdma"),
    "deepep": ("deepep_nvlink_dispatch", "deepep_nvlink_combine", "deepep_rdma_dispatch", "deepep_rdma_combine"),
    "hybridep": ("hybridep_nvlink", "hybridep_nvlink", "hybridep_rdma", "hybridep_rdma"),
}


def ep_peer_shares(c: TrainingConfig, nvlink_domain: int) -> tuple[float, float]:
    """(share of a rank's routed tokens that go to an EP peer in its NVLink domain, share that
    leave it), balanced routing. EP peers are ETP ranks apart."""
    etp = c.etp or c.tp
    inside = max(1, min(c.ep, nvlink_domain // etp)) if etp <= nvlink_domain else 1
    return (inside - 1) / c.ep, (c.ep - inside) / c.ep


# dispatchers that send a token once to each peer rank and each remote NVLink domain holding any of
# its experts (and forward it over NVLink there), not once per expert
DEDUPLICATING = ("deepep", "hybridep")


def domain_hit(m: ModelArch, domains: int) -> float:
    """Chance that one given NVLink domain of an EP group (of `domains` equal, contiguous shares of
    the experts) holds any of a token's top-k experts, routing balanced. Uniform over the experts;
    under group-limited routing (moe_router_num_groups, moe_router_group_topk: DeepSeek-V3's
    node-limited routing) a token's experts lie in the groups it picked, and each picked group
    receives one at least (Megatron picks groups by their top experts' scores)."""
    k, experts = m.moe_router_topk, m.num_experts
    local = experts // domains  # experts in one domain
    groups, picked = m.moe_router_num_groups, m.moe_router_group_topk
    if groups and picked and picked < groups and experts % groups == 0:
        if domains <= groups and groups % domains == 0:  # a domain holds whole groups
            return 1 - math.comb(groups - groups // domains, picked) / math.comb(groups, picked)
        if domains % groups == 0:  # a group spans domains: its experts among the picked groups'
            candidates = picked * experts // groups
            return picked / groups * (1 - math.comb(candidates - local, k) / math.comb(candidates, k))
    return 1 - math.comb(experts - local, k) / math.comb(experts, k)


def remote_domain_share(m: ModelArch, c: TrainingConfig, nvlink_domain: int) -> float:
    """Distinct remote NVLink domains a token's top-k experts sit in, over the copies of it that
    leave its domain, routing balanced: what a deduplicating dispatcher sends across."""
    inside, across = ep_peer_shares(c, nvlink_domain)
    copies = m.moe_router_topk * across
    if copies <= 0:
        return 1.0
    domains = round(1 / (1 - across)) if across < 1 else c.ep  # EP group's domains, equal shares
    return (domains - 1) * domain_hit(m, domains) / copies


def rank_dedup_share(m: ModelArch, c: TrainingConfig) -> float:
    """Distinct EP ranks a token's top-k experts sit on, over its k copies, routing balanced: what a
    deduplicating dispatcher sends a peer inside its domain (one copy a rank, not one an expert; its
    combine sums a rank's experts before sending back)."""
    return c.ep * domain_hit(m, c.ep) / m.moe_router_topk if c.ep > 1 else 1.0


def a2a(m: ModelArch, c: TrainingConfig, gpu_type: str, nvlink_domain: int, rates: Rates) -> dict:
    """The expert all-to-all of one MoE layer for one micro-batch: dispatch and combine forward,
    and their mirror in backward (and the forward's again where recompute reruns the layer: passes).
    Each runs NVLink and NIC transfers at once: the slower sets it.
    DeepEP and HybridEP send a token once to each peer rank in their domain that holds any of its
    experts (rank_dedup_share) and across once per remote domain (remote_domain_share)."""
    name = dispatcher_name(c)
    if name == "allgather":
        return allgather(m, c, gpu_type, nvlink_domain, rates)
    sent = tokens(m, c) / c.tp * m.moe_router_topk * m.hidden_size * BF16  # sequence parallel: T/TP each
    inside, across = ep_peer_shares(c, nvlink_domain)
    if name in DEDUPLICATING:
        inside *= rank_dedup_share(m, c)
        across *= remote_domain_share(m, c, nvlink_domain)
    nvl_d, nvl_c, nic_d, nic_c = (rates[r] for r in A2A_ROWS[name])
    nvlink, nic = gpus.GPUS[gpu_type].nvlink_gb_s * 1e9, rates["nic_gb_s"] * 1e9
    one = lambda nvl, rdma: max(sent * inside / (nvlink * nvl), sent * across / (nic * rdma))  # noqa: E731
    dispatch, combine = one(nvl_d, nic_d), one(nvl_c, nic_c)
    on_nic = sent * across / nic * (1 / nic_d + 1 / nic_c)
    n = a2a_passes(c)
    return {"dispatcher": name, "bytes_sent": sent, "share_in_nvlink": inside, "share_across": across,
            "dispatch_ms": 1e3 * dispatch, "combine_ms": 1e3 * combine, "passes": n,
            "ms": n * 1e3 * (dispatch + combine), "nic_ms": n * 1e3 * on_nic}


def a2a_passes(c: TrainingConfig) -> int:
    """Times a micro-batch's dispatch and combine run: forward, backward, and forward again where
    recompute reruns the MoE layer."""
    return 3 if reruns_moe_forward(c) else 2


def allgather(m: ModelArch, c: TrainingConfig, gpu_type: str, nvlink_domain: int, rates: Rates) -> dict:
    """The allgather dispatcher of one MoE layer for one micro-batch: every rank's tokens (T/TP each)
    gathered over the EP group, whatever experts they go to, and the experts' output
    reduce-scattered back; forward and mirrored in backward, as ring collectives over the group
    (EP ranks ETP apart: NVLink while they fit a domain, else the NIC)."""
    whole = c.ep * tokens(m, c) / c.tp * m.hidden_size * BF16
    rate, link = link_rate(c.ep * (c.etp or c.tp), gpu_type, nvlink_domain, rates)
    one = ring_ms(whole, c.ep, rate)
    inside, across = ep_peer_shares(c, nvlink_domain)
    n = a2a_passes(c)
    return {"dispatcher": "allgather", "bytes_sent": whole * (c.ep - 1) / c.ep, "share_in_nvlink": inside,
            "share_across": across, "link": link, "dispatch_ms": one, "combine_ms": one, "passes": n,
            "ms": 2 * n * one, "nic_ms": 2 * n * one if link == "nic" else 0.0}


def cp_exchange(m: ModelArch, c: TrainingConfig, layers: int, gpu_type: str, nvlink_domain: int,
                rates: Rates) -> dict:
    """Context parallel's ring attention for one micro-batch: in each of CP-1 steps a rank passes its
    share of the sequence's keys and values to the next CP rank; backward passes them again with
    their gradients (three times the forward's bytes), and recompute of attention the forward's
    again. CP peers are TP ranks apart. Taken as
    exposed: the rate table has no row for how much of it attention hides."""
    if c.cp <= 1:
        return {"ms": 0.0}
    if m.multi_latent_attention:
        dims = (m.qk_head_dim or 0) + (m.qk_pos_emb_head_dim or 0) + (m.v_head_dim or 0)
        per_token = m.num_attention_heads * dims / c.tp
    else:
        d = m.kv_channels or m.hidden_size // m.num_attention_heads
        per_token = 2 * d * max(m.num_query_groups / c.tp, 1)
    nbytes = tokens(m, c) * per_token * BF16
    rate, link = link_rate(c.tp * c.cp, gpu_type, nvlink_domain, rates)
    again = reruns_attention(c)  # the ring's forward
    return {"ms": (3 + again) * (c.cp - 1) * layers * 1e3 * nbytes / rate, "bytes": nbytes, "link": link}


def link_rate(span: int, gpu_type: str, nvlink_domain: int, rates: Rates) -> tuple[float, str]:
    """(bytes/s, link) of a ring collective over a group `span` consecutive ranks wide."""
    if span <= nvlink_domain:
        return gpus.GPUS[gpu_type].nvlink_gb_s * 1e9 * rates["collective_nvlink"], "nvlink"
    return rates["nic_gb_s"] * 1e9 * rates["collective_rdma"], "nic"


def ring_ms(nbytes: float, size: int, rate: float) -> float:
    """An all-gather or reduce-scatter of `nbytes` (the whole tensor) over `size` ranks."""
    return 0.0 if size <= 1 else 1e3 * nbytes * (size - 1) / size / rate


def tp_collectives(m: ModelArch, c: TrainingConfig, layers: int, moe_layers: int, gpu_type: str,
                   nvlink_domain: int, rates: Rates) -> dict:
    """Sequence parallel's all-gather and reduce-scatter of a layer's activations, two pairs a
    dense layer forward (attention, MLP) and one a MoE layer with ETP 1 (its experts take the
    split tokens through the all-to-all); backward mirrors them, and recompute runs the forward's
    again for what it reruns."""
    if c.tp <= 1:
        return {"ms": 0.0, "collectives": 0}
    per_layer_moe = 2 if (c.etp or c.tp) == 1 else 4
    forward = 4 * (layers - moe_layers) + per_layer_moe * moe_layers
    count = 2 * forward
    if c.recompute_granularity == "full":  # the layers' forward again
        count += forward
    elif reruns_moe_forward(c) and per_layer_moe == 4:  # the experts' pair again
        count += 2 * moe_layers
    rate, link = link_rate(c.tp, gpu_type, nvlink_domain, rates)
    one = ring_ms(tokens(m, c) * m.hidden_size * BF16, c.tp, rate)
    return {"ms": count * one, "collectives": count, "link": link, "each_ms": one}


def pp_sends(m: ModelArch, c: TrainingConfig, rates: Rates) -> dict:
    """A stage's sends of one micro-batch's activations forward and gradients backward, once per
    virtual stage; pipeline stages are world/PP ranks apart, so across nodes on a multi-node job."""
    if c.pp <= 1:
        return {"ms": 0.0}
    nbytes = tokens(m, c) * m.hidden_size * BF16 / (c.tp if c.sequence_parallel else 1)
    ms = 2 * (c.vpp or 1) * 1e3 * nbytes / (rates["nic_gb_s"] * 1e9)
    return {"ms": ms, "bytes": nbytes}


def dp_sync(dense: float, experts: float, c: TrainingConfig, world: int, gpu_type: str,
            nvlink_domain: int, rates: Rates) -> dict:
    """Gradient reduce-scatter and (distributed optimizer) parameter all-gather of one stage's
    parameters (`dense` over the DP x CP group, `experts` over the expert-data-parallel group);
    without the distributed optimizer an all-reduce, twice the reduce-scatter, and no gather."""
    dp = world // (c.tp * c.pp)  # DP x CP
    edp = world // ((c.etp or c.tp) * c.ep * c.pp)
    d_rate, d_link = link_rate(world // c.pp, gpu_type, nvlink_domain, rates)
    reduce = ring_ms(dense * GRAD_BYTES, dp, d_rate) + ring_ms(experts * GRAD_BYTES, edp, d_rate)
    gather = ring_ms(dense * PARAM_BYTES, dp, d_rate) + ring_ms(experts * PARAM_BYTES, edp, d_rate)
    if not c.distributed_optimizer:
        reduce, gather = 2 * reduce, 0.0
    return {"reduce_ms": reduce, "gather_ms": gather, "dp": dp, "edp": edp, "link": d_link,
            "grad_bytes": (dense + experts) * GRAD_BYTES}


def fsdp_sync(dense: float, experts: float, c: TrainingConfig, world: int, gpu_type: str,
              nvlink_domain: int, rates: Rates) -> dict:
    """Megatron FSDP's collectives of one stage's parameters (`dense` over the DP x CP group,
    `experts` over the expert-data-parallel group), gradients in bf16 (estimate/fsdp.py). Under
    optim_grads_params every micro-batch gathers the weights layer by layer in forward and again in
    backward, and reduce-scatters the gradients layer by layer in backward; under optim_grads only
    the reduce-scatter runs each micro-batch and the (replicated) weights are gathered once after the
    step; under optim and no_shard the reduce waits for the last micro-batch, as the distributed
    optimizer's and DDP's do (megatron_fsdp.py: is_delay_grad_reduce)."""
    dp = world // (c.tp * c.pp)  # DP x CP
    edp = world // ((c.etp or c.tp) * c.ep * c.pp)
    rate, link = link_rate(world // c.pp, gpu_type, nvlink_domain, rates)
    gather = ring_ms(dense * fsdp.PARAM_BYTES, dp, rate) + ring_ms(experts * fsdp.PARAM_BYTES, edp, rate)
    reduce = ring_ms(dense * fsdp.GRAD_BYTES, dp, rate) + ring_ms(experts * fsdp.GRAD_BYTES, edp, rate)
    s = fsdp.STRATEGIES[c.fsdp_sharding]
    return {"strategy": c.fsdp_sharding, "dp": dp, "edp": edp, "link": link,
            "param_bytes": (dense + experts) * fsdp.PARAM_BYTES,
            "forward_gather_ms": gather if s.weights else 0.0,  # a micro-batch's
            "backward_gather_ms": gather if s.weights else 0.0,
            "backward_reduce_ms": reduce if s.grads else 0.0,
            "step_reduce_ms": 0.0 if s.grads else reduce * (1 if s.optimizer else 2),  # no_shard: all-reduce
            "step_gather_ms": gather if s.optimizer and not s.weights else 0.0}

"""A training step's time from its terms: each pipeline stage's compute and host time per
micro-batch, what the expert all-to-all and tensor-parallel collectives add, pipeline sends,
the pipeline's fill and drain, the data-parallel gradient reduce and parameter gather left exposed,
and the optimizer's step.

    step = m x (compute + host + a2a + tp + pp_send + cp) of the slowest stage
           + fill/drain ((PP-1)/VPP of that stage's micro-batch time)
           + exposed DP reduce + exposed DP gather + optimizer

with m = global batch / (micro batch x DP) micro-batches per step. Under Megatron FSDP the weights'
gathers and the gradients' reduce-scatters of each micro-batch (comm.fsdp_sync) run in the stage's
stream too; what its compute leaves exposed is reported in the DP gather and reduce terms."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moetune.estimate import comm, flops, kernels
from moetune.estimate.band import Band
from moetune.estimate.memory import attention_params, min_gpus, padded_vocab
from moetune.estimate.rates import Rates
from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch

# Adam's step on each sharded parameter: read fp32 gradient, master, two moments; write master,
# moments and the bf16 weight
OPTIMIZER_BYTES = 4 * 4 + 3 * 4 + 2
ASSUMPTIONS = (
    "routing balanced: every rank's experts get top-k times its tokens, and send as much as they receive",
    "tokens cross the all-to-all in BF16",
    "a stage's micro-batch time is the larger of its host's launch time and its stream's time (compute "
    "plus the communication left exposed), and more near balance, where the host's waits on the GPU "
    "keep it from running ahead: as moetune's own TE grouped-GEMM trace replays it (host_wait_excess)",
    "CUDA graphs remove the launches of the scopes they capture (all of them for a whole-iteration graph)",
    "the data-parallel reduce overlaps at most one micro-batch's backward, the gather one forward",
)


@dataclass(frozen=True)
class Node:
    """The cluster as the model sees it."""
    gpu_type: str
    gpus_per_node: int
    nvlink_domain: int
    has_apex: bool = True
    """The image has apex's fused kernels: Megatron's gradient-accumulation fusion is on (trials
    render --no-gradient-accumulation-fusion where it has not)."""

    @classmethod
    def of(cls, cluster) -> Node:
        return cls(cluster.gpu_type, cluster.gpus_per_node, cluster.nvlink_domain, cluster.has_apex is not False)


@dataclass
class Prediction:
    step_time_ms: float
    tokens_per_s_per_gpu: float
    terms: dict[str, float]  # ms a step each; they add up to step_time_ms
    compute_source: str  # analytic | fit
    inputs: dict = field(default_factory=dict)
    rates: dict = field(default_factory=dict)
    assumptions: tuple[str, ...] = ASSUMPTIONS
    band: Band | None = None  # the step low to high over the rates' spread, where asked for (price)

    def to_dict(self) -> dict:
        r = lambda v: round(v, 3) if isinstance(v, float) else v  # noqa: E731
        return {"step_time_ms": round(self.step_time_ms, 3),
                "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
                "terms": {k: round(v, 3) for k, v in self.terms.items()},
                "compute_source": self.compute_source,
                "inputs": {k: ({kk: r(vv) for kk, vv in v.items()} if isinstance(v, dict) else r(v))
                           for k, v in self.inputs.items()},
                "rates": self.rates, "assumptions": list(self.assumptions),
                **({"band": self.band.to_dict()} if self.band is not None else {})}


def stage_params(m: ModelArch, c: TrainingConfig, layers: int, moe_layers: int, first: bool,
                 last: bool) -> tuple[float, float]:
    """(dense, expert) parameters one rank of a stage holds (dense split by TP, experts by ETP x EP)."""
    h = m.hidden_size
    dense_layers = layers - moe_layers
    dense = (attention_params(m) * layers + 3 * h * m.ffn_hidden_size * dense_layers
             + 3 * h * (m.moe_shared_expert_intermediate_size or 0) * moe_layers) / c.tp
    dense += 2 * h * layers + h * m.num_experts * moe_layers  # norms and routers, whole on each rank
    dense += (first + last) * h * padded_vocab(m, c.tp) / c.tp  # embedding, output layer
    experts = 3 * h * m.moe_ffn_hidden_size * m.num_experts * moe_layers / ((c.etp or c.tp) * c.ep)
    return dense, experts


def micro_batches(c: TrainingConfig, world: int) -> int:
    return max(1, c.global_batch // (c.micro_batch * max(c.data_parallel(world), 1)))


def bubble_fraction(c: TrainingConfig, m: int) -> float:
    """Fill and drain over the step's steady part: (PP - 1) / (VPP x m)."""
    return (c.pp - 1) / ((c.vpp or 1) * m)


# the scopes TE's partial CUDA graphs capture in the measurement of `cuda_graph_te_launches_removed`
GRAPHED_SCOPES = ("attn", "moe_router", "moe_preprocess")


def graphed_share(c: TrainingConfig, rates: Rates) -> float:
    """Share of a micro-batch's launches CUDA graphs replay instead of the host: all of them for a
    whole-iteration graph (or one without scopes), the measured share for TE's partial graphs,
    split evenly among the measured scopes where fewer are graphed."""
    if c.cuda_graph_impl in (None, "none"):
        return 0.0
    if c.cuda_graph_impl == "full_iteration" or not c.cuda_graph_modules:
        return 1.0
    scopes = sum(m in c.cuda_graph_modules for m in GRAPHED_SCOPES)
    return rates["cuda_graph_te_launches_removed"] * scopes / len(GRAPHED_SCOPES)


def host_ms(kernels: float, c: TrainingConfig, rates: Rates) -> float:
    """The host's time to launch a stage's kernels for one micro-batch: those CUDA graphs leave to
    it, more under FP8 (its casts), at the measured cost a launch. The CPUs a rank has do not enter:
    one host thread launches, and from 2 to 16 cores a rank the step did not move (rates.py)."""
    launched = kernels * (1 - graphed_share(c, rates)) * (rates["fp8_launch_factor"] if c.fp8_format else 1.0)
    return launched * rates["host_us_per_kernel"] / 1e3


def ep_overlapped_share(c: TrainingConfig, micro_batches: int, stage: int = 0) -> float:
    """The share of a stage's micro-batch passes whose all-to-all the EP overlap can hide: it runs one
    micro-batch's forward beside another's backward, so the passes of the schedule's warm-up and
    cool-down run alone. Without a pipeline the first forward and the last backward (of M
    micro-batches, (M-1)/M pair up); with one, the warm-up of interleaved 1F1B, (PP-stage-1)*2 +
    (VPP-1)*PP chunks of M*VPP (Megatron's get_num_warmup_microbatches), without VPP PP-stage-1."""
    if c.pp <= 1:
        return (micro_batches - 1) / micro_batches if micro_batches else 0.0
    v = c.vpp or 1
    total = micro_batches * v
    warmup = (c.pp - stage - 1) * 2 + (v - 1) * c.pp if v > 1 else c.pp - stage - 1
    return max(0, total - min(total, warmup)) / total if total else 0.0


def fsdp_exposed(fs: dict, layers: int, forward: float, backward: float) -> tuple[float, float]:
    """(gather, reduce) ms of one micro-batch's Megatron FSDP collectives (comm.fsdp_sync) that its
    compute does not hide. They run a layer at a time, beside the compute of the layer before (the
    next layer's weights prefetched): the gather of a pass's first layer and the reduce of its last
    have nothing to hide behind; the rest hide as far as the pass's compute lasts, as the
    distributed optimizer's overlapped gather and reduce do."""
    n = max(layers, 1)
    gf, gb, rb = fs["forward_gather_ms"], fs["backward_gather_ms"], fs["backward_reduce_ms"]
    rest_f = max(0.0, gf * (1 - 1 / n) - forward)
    rest_b = max(0.0, (gb + rb) * (1 - 1 / n) - backward)
    share_g = gb / (gb + rb) if gb + rb else 0.0
    return gf / n + rest_f + gb / n + rest_b * share_g, rb / n + rest_b * (1 - share_g)


def nic_traffic(a2a: dict | None, moe_layers: int, fs: dict | None, pp_ms: float, tp: dict,
                cp: dict) -> dict[str, float]:
    """A micro-batch's time on its rank's NIC (ms), by the stage's key of the term whose traffic it is:
    the all-to-all's share across domains, Megatron FSDP's collectives and context parallel's or
    TP's exchange where their groups leave the domain, and the pipeline's sends (over the NIC)."""
    out = {"a2a": a2a["nic_ms"] * moe_layers if a2a else 0.0, "pp": pp_ms,
           "tp": tp["ms"] if tp.get("link") == "nic" else 0.0,
           "cp": cp["ms"] if cp.get("link") == "nic" else 0.0}
    if fs and fs["link"] == "nic":
        out["fsdp_gather"] = fs["forward_gather_ms"] + fs["backward_gather_ms"]
        out["fsdp_reduce"] = fs["backward_reduce_ms"]
    return {k: v for k, v in out.items() if v > 0}


def grad_accumulation_fused(c: TrainingConfig, node: Node) -> bool:
    """TE's linears add each weight's gradient into its main_grad inside the wgrad GEMM, one launch
    fewer a weight (measured: benchmarks/results/host_cost.json); as the trials render it, on
    with TE where the image has apex."""
    return c.transformer_impl != "local" and node.has_apex


def virtual_stage_host_ms(c: TrainingConfig, rates: Rates) -> float:
    """The host's time a rank's virtual stages add to a micro-batch: VPP stages make 2 (VPP - 1)
    passes (forward and backward) through the schedule beyond one stage's two, each at the measured
    host time a pass, most of it the schedule's own Python, not launches. A whole-iteration graph
    replays the schedule; TE's partial graphs leave it to the host."""
    v = c.vpp or 1
    if c.pp == 1 or v == 1 or c.cuda_graph_impl == "full_iteration":
        return 0.0
    return 2 * (v - 1) * rates["host_ms_per_virtual_stage_pass"]


def predict(m: ModelArch, c: TrainingConfig, node: Node, world: int, rates: Rates | None = None,
            measured_ms: float | None = None) -> Prediction:
    """The step's predicted time. `measured_ms`: a fit's or one-GPU trial's measured time of one
    micro-batch on the slowest stage's rank (compute and host together, no communication), which
    replaces the analytic compute and host time (each stage scaled alike)."""
    rates = rates or Rates()
    if world % min_gpus(c):
        raise ValueError(f"TP{c.tp} PP{c.pp} EP{c.ep} CP{c.cp} needs a multiple of {min_gpus(c)} GPUs; {world} given")
    mb = micro_batches(c, world)
    works = flops.stage_work(m, c, rates)
    a2a = comm.a2a(m, c, node.gpu_type, node.nvlink_domain, rates) if m.num_experts > 1 and c.ep > 1 else None
    stages: list[dict[str, Any]] = []
    table = kernels.table_for(node.gpu_type)
    passes_ms = virtual_stage_host_ms(c, rates)  # the same on every stage: each has VPP chunks
    for w in works:
        parts = flops.compute_ms(w, c, node.gpu_type, rates, table)
        gpu = sum(parts.values())
        host = host_ms(w.kernels - (w.grad_adds if grad_accumulation_fused(c, node) else 0.0), c, rates) + passes_ms
        stages.append({"work": w, "parts": parts, "gpu": gpu, "host": host})
    source = "analytic"
    if measured_ms:
        slowest = max(max(s["gpu"], s["host"]) for s in stages)
        for s in stages:  # the measurement is the stage's pace, whichever of GPU and host set it
            s["gpu"], s["host"] = max(s["gpu"], s["host"]) * measured_ms / slowest, 0.0
        source = "fit"
    for s in stages:
        w = s["work"]
        s["compute"] = s["gpu"]
        a2a_ms = a2a["ms"] * w.moe_layers if a2a else 0.0
        share = rates["ep_overlap_hidden"] * ep_overlapped_share(c, mb, w.index) if c.overlap_ep_a2a else 0.0
        hidden = min(a2a_ms * share, s["gpu"])
        s["a2a"], s["a2a_total"] = a2a_ms - hidden, a2a_ms
        tp = comm.tp_collectives(m, c, w.layers, w.moe_layers, node.gpu_type, node.nvlink_domain, rates)
        s["tp"] = tp["ms"] * (1 - rates["tp_overlap_hidden"] if c.tp_comm_overlap else 1.0)
        pp = comm.pp_sends(m, c, rates)["ms"]
        # the interleaved schedule sends beside the next chunk's compute (Megatron's overlap_p2p_comm)
        s["pp"] = max(0.0, pp - s["gpu"]) if c.p2p_overlapped else pp
        s["pp_total"] = pp
        dense, experts = stage_params(m, c, w.layers, w.moe_layers, w.index == 0, w.index == c.pp - 1)
        backward, forward = s["gpu"] * 2 / 3, s["gpu"] / 3
        fs = comm.fsdp_sync(dense, experts, c, world, node.gpu_type, node.nvlink_domain, rates) if c.fsdp else None
        s["fsdp_gather"], s["fsdp_reduce"] = fsdp_exposed(fs, w.layers, forward, backward) if fs else (0.0, 0.0)
        cp = comm.cp_exchange(m, c, w.layers, node.gpu_type, node.nvlink_domain, rates)
        s["cp"] = cp["ms"]
        # the host queues launches ahead of the GPU's stream, communication included, so the larger
        # of the two sets the pace; but where the host waits on the GPU (a dropless MoE layer's
        # token counts) the queue empties and the GPU waits for the launches after it, which
        # costs most near balance (host_wait_excess, replayed from moetune's own trace)
        stream = s["compute"] + s["a2a"] + s["tp"] + s["pp"] + s["cp"] + s["fsdp_gather"] + s["fsdp_reduce"]
        excess = rates.curve("host_wait_excess").at(s["host"] / stream) if stream else 0.0
        s["host_exposed"] = max(s["host"], stream) * (1 + excess) - stream
        s["micro_batch"] = stream + s["host_exposed"]
        # a NIC carries no more than its rate: where a micro-batch's traffic across it (hidden or
        # not) outlasts the micro-batch, it sets the pace, the excess shared by that traffic's terms
        nic = nic_traffic(a2a, w.moe_layers, fs, pp, tp, cp)
        s["nic_busy"] = sum(nic.values())
        if s["nic_busy"] > s["micro_batch"]:
            for k, v in nic.items():
                s[k] += (s["nic_busy"] - s["micro_batch"]) * v / s["nic_busy"]
            s["micro_batch"] = s["nic_busy"]
        dp = comm.dp_sync(dense, experts, c, world, node.gpu_type, node.nvlink_domain, rates)
        if fs:  # FSDP's own collectives replace the data-parallel ones: what is left once a step
            dp = {**fs, "reduce_ms": fs["step_reduce_ms"], "gather_ms": fs["step_gather_ms"],
                  "exposed_gather_ms_per_micro_batch": s["fsdp_gather"],
                  "exposed_reduce_ms_per_micro_batch": s["fsdp_reduce"]}
        s["dp_reduce"] = max(0.0, dp["reduce_ms"] - backward) if c.overlap_grad_reduce else dp["reduce_ms"]
        s["dp_gather"] = max(0.0, dp["gather_ms"] - forward) if c.overlap_param_gather else dp["gather_ms"]
        s["dp"] = dp
        sharded = c.distributed_optimizer or (c.fsdp and c.fsdp_sharding != "no_shard")
        shards = (dense / dp["dp"] + experts / dp["edp"]) if sharded else dense + experts
        opt_bytes = shards * OPTIMIZER_BYTES + (dense + experts) * 2 * comm.GRAD_BYTES  # + zero, norm
        g = gpus.GPUS[node.gpu_type]
        s["optimizer"] = 1e3 * opt_bytes / (g.hbm_tb_s * 1e12 * rates["hbm_efficiency"])
    top = max(stages, key=lambda s: s["micro_batch"])
    bubble = (c.pp - 1) / (c.vpp or 1) * top["micro_batch"]
    if c.p2p_overlapped:  # fill and drain wait on each stage's send: PP-1 hops forward and backward
        bubble += (c.pp - 1) * top["pp_total"] / c.vpp
    terms = {"compute": mb * top["compute"], "host_launch": mb * top["host_exposed"],
             "ep_a2a": mb * top["a2a"], "tp_collectives": mb * top["tp"], "pp_sends": mb * top["pp"],
             "cp_exchange": mb * top["cp"],
             "pipeline_bubble": bubble,
             "dp_grad_reduce": max(s["dp_reduce"] for s in stages) + mb * top["fsdp_reduce"],
             "dp_param_gather": max(s["dp_gather"] for s in stages) + mb * top["fsdp_gather"],
             "optimizer": max(s["optimizer"] for s in stages)}
    step = sum(terms.values())
    seq = c.seq_length or m.seq_length
    inputs = {"world": world, "micro_batches": mb, "data_parallel": c.data_parallel(world),
              "bubble_fraction": bubble_fraction(c, mb), "slowest_stage": top["work"].index,
              "gpu_type": node.gpu_type, "nvlink_domain": node.nvlink_domain,
              "precision": "fp8" if c.fp8_format else "bf16",
              "stage_micro_batch_ms": {str(s["work"].index): s["micro_batch"] for s in stages},
              "slowest_stage_work": top["work"].to_dict(),
              "compute_ms_per_micro_batch": top["compute"], "compute_parts_ms": top["parts"],
              "host_launch_ms_per_micro_batch": top["host"],
              "virtual_stage_host_ms_per_micro_batch": 0.0 if measured_ms else passes_ms,
              "ep_a2a_ms_per_micro_batch": top["a2a_total"], "nic_ms_per_micro_batch": top["nic_busy"],
              "ep_overlap": c.overlap_ep_a2a,
              "ep_a2a_per_layer": a2a or {}, "dp_sync": top["dp"], "fsdp": c.fsdp,
              "kernel_table": table.source}
    return Prediction(step, c.global_batch * seq / (step / 1e3) / world, terms, source, inputs,
                      {n: rates.rows[n].to_dict() for n in rates.rows})

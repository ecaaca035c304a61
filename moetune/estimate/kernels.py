"""A layout's matrix kernels by shape, and what one GPU was measured to reach at each shape (the
kernel table): the step-time model prices a layer's GEMMs and attention from it, not from a curve
through trial medians.

A table is the kernel probe's record (workloads/kernel_probe.py, run on a GPU by
benchmarks/device/kernels.sh): rows of GEMMs ([m, k] @ [k, n], BF16 and tensorwise FP8) and causal
attention, timed on random data back to back on a warm GPU. The reference machine's tables ship in
kernel_tables/ (one file a GPU type). A shape the table lacks takes the rate of its nearest measured
shape (log-distance over m, k, n; over sequence, heads, dim for attention): never a rate above what
that GPU was measured to reach.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch

TABLES = Path(__file__).resolve().parent / "kernel_tables"
GROUPED_KINDS = ("experts",)  # run as TE's GroupedLinear, one GEMM a local expert
# TE's FP8 recipes by the name the probe records them under, and what a config's fp8_recipe runs
# (Megatron's default, unset, is delayed scaling)
RECIPES = ("bf16", "delayed", "tensorwise", "blockwise")
REFERENCE_GPU = "H200"  # the GPU type whose shipped table stands, scaled, for types with none


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a layer's forward on one rank: [m, k] @ [k, n], run `calls` times a layer (an
    MoE layer's experts: once for each expert the rank holds)."""
    kind: str  # the FLOP kind it belongs to (flops.layer_flops): attention_proj, experts, ...
    m: int
    k: int
    n: int
    calls: int = 1

    def passes(self) -> tuple[tuple[int, int, int], ...]:
        """The forward, the data gradient ([m, n] @ [n, k]) and the weight gradient ([k, m] @ [m, n])."""
        return (self.m, self.k, self.n), (self.m, self.n, self.k), (self.k, self.m, self.n)


def _tokens(m: ModelArch, c: TrainingConfig) -> int:
    return int((c.seq_length or m.seq_length) * c.micro_batch // c.cp)


def _mlp(kind: str, t: int, h: int, ffn: int, split: int, calls: int = 1) -> list[Gemm]:
    """A SwiGLU MLP: the fused gate-and-up GEMM, then the down one."""
    if t < 1 or ffn < 1:
        return []
    return [Gemm(kind, t, h, 2 * ffn // split, calls), Gemm(kind, t, ffn // split, h, calls)]


def layer_gemms(m: ModelArch, c: TrainingConfig, moe: bool) -> list[Gemm]:
    """The GEMMs of one decoder layer's forward on one rank. Tensor parallelism splits the output
    width of the column-parallel GEMMs and the input width of the row-parallel ones (sequence
    parallel gathers the tokens first, so m is the micro-batch's tokens). A rank's experts each get
    top-k x its EP group's tokens / experts, balanced; expert tensor parallelism splits the
    experts' widths (folding)."""
    t, h, tp = _tokens(m, c), m.hidden_size, max(c.tp, 1)
    heads = m.num_attention_heads
    if m.multi_latent_attention:
        qk = (m.qk_head_dim or 0) + (m.qk_pos_emb_head_dim or 0)
        kv_up, kv_rank = heads * ((m.qk_head_dim or 0) + (m.v_head_dim or 0)) // tp, m.kv_lora_rank or 0
        out = [Gemm("attention_proj", t, h, kv_rank + (m.qk_pos_emb_head_dim or 0)),
               Gemm("attention_proj", t, kv_rank, kv_up),
               Gemm("attention_proj", t, heads * (m.v_head_dim or 0) // tp, h)]
        if m.q_lora_rank:
            q_up = heads * qk // tp
            out += [Gemm("attention_proj", t, h, m.q_lora_rank), Gemm("attention_proj", t, m.q_lora_rank, q_up)]
        else:
            out.append(Gemm("attention_proj", t, h, heads * qk // tp))
    else:
        d = m.kv_channels or h // heads
        out = [Gemm("attention_proj", t, h, (heads + 2 * m.num_query_groups) * d // tp),
               Gemm("attention_proj", t, heads * d // tp, h)]
    if not moe:
        return out + _mlp("dense_mlp", t, h, m.ffn_hidden_size, tp)
    etp = max(c.etp or c.tp, 1)
    local = max(1, m.num_experts // max(c.ep, 1))
    per_expert = round(t * m.moe_router_topk * max(c.ep, 1) * etp / (m.num_experts * tp))
    out += _mlp("experts", per_expert, h, m.moe_ffn_hidden_size, etp, local)
    out += _mlp("shared_experts", t, h, m.moe_shared_expert_intermediate_size or 0, tp)
    out.append(Gemm("router", t, h, m.num_experts))
    return out


def output_gemm(m: ModelArch, c: TrainingConfig, vocab: int) -> Gemm:
    """The output layer's GEMM (vocabulary split by TP)."""
    return Gemm("output", _tokens(m, c), m.hidden_size, vocab // max(c.tp, 1))


@dataclass(frozen=True)
class Attention:
    """Causal attention of one micro-batch on one rank."""
    batch: int
    seq: int
    heads: int
    groups: int
    dim: int

    def forward_flop(self) -> float:
        """Forward FLOPs: the score and value products, half the score matrix under the causal mask."""
        return 4 * self.batch * self.heads * self.seq ** 2 * self.dim * 0.5


def attention_shape(m: ModelArch, c: TrainingConfig) -> Attention:
    """TP splits the heads; CP the queries (taken as its share of the sequence); MLA as one head dim,
    its query/key one."""
    tp = max(c.tp, 1)
    if m.multi_latent_attention:
        dim, groups = (m.qk_head_dim or 0) + (m.qk_pos_emb_head_dim or 0), m.num_attention_heads
    else:
        dim, groups = m.kv_channels or m.hidden_size // m.num_attention_heads, m.num_query_groups
    return Attention(c.micro_batch, (c.seq_length or m.seq_length) // max(c.cp, 1),
                     max(1, m.num_attention_heads // tp), max(1, groups // tp), dim)


def _log_distance(a, b) -> float:
    return sum((math.log(x) - math.log(y)) ** 2 for x, y in zip(a, b, strict=True))


def recipe_rows(c: TrainingConfig) -> str:
    """The layer rows that price a config's GEMMs: "bf16", or its FP8 recipe's. Delayed scaling runs
    the same per-tensor-scaled GEMMs and casts as current scaling, without its amax pass: priced from
    the tensorwise rows (the probe's delayed rows enter TE's autocast once a layer call, so they carry
    the amax and scale update Megatron runs once a transformer layer on every GEMM). MXFP8 has no
    rows (no Hopper runs it): the tensorwise ones."""
    if not c.fp8_format:
        return "bf16"
    return "blockwise" if c.fp8_recipe == "blockwise" else "tensorwise"


def precision(recipe: str) -> str:
    """The data type a recipe's GEMMs run in: "bf16" or "fp8"."""
    return "bf16" if recipe == "bf16" else "fp8"


class KernelTable:
    """One GPU type's measured kernels (a kernel probe's record). `scale`: for a GPU type no table was
    measured on, its data-sheet peaks over the measured GPU's ({"bf16": x, "fp8": y}): the measured
    GPU's share of its peak at each shape, at the other's peak."""

    def __init__(self, record: dict, source: str, scale: dict[str, float] | None = None):
        self.gpu = record.get("gpu", "?")
        self.source = source
        self.scale = scale or {"bf16": 1.0, "fp8": 1.0}
        self.gemms: dict[str, dict[tuple[int, int, int], float]] = {}
        self.attention: dict[tuple[int, int, int, int, int], tuple[float, float]] = {}
        # recipe: (m, k, n, groups): (µs forward and backward, FLOPs as run: rounded up to the block)
        self.layers: dict[str, dict[tuple[int, int, int, int], tuple[float, float]]] = {}
        # a shape's nearest measured one, found once: a layout is priced many times (plan, a band)
        self._nearest: dict[tuple, Any] = {}
        for r in record.get("rows", []):
            if r.get("host_ahead") is False:  # timed the host's gaps too: not a GPU rate
                continue
            if r.get("kind") == "gemm" and r.get("tflop_s", 0) > 0:
                self.gemms.setdefault(r["dtype"], {})[(r["m"], r["k"], r["n"])] = float(r["tflop_s"])
            elif r.get("kind") == "attention" and r.get("fwd_us", 0) > 0:
                key = (r["batch"], r["seq"], r["heads"], r["groups"], r["dim"])
                self.attention[key] = (float(r["fwd_us"]), float(r["bwd_us"]))
            elif r.get("kind") == "layer" and r.get("fwd_us", 0) > 0:
                rm, rk, rn = r.get("run_as") or (r["m"], r["k"], r["n"])
                us = float(r["fwd_us"]) + float(r["bwd_us"])
                self.layers.setdefault(r["recipe"], {})[(r["m"], r["k"], r["n"], r["groups"])] = (
                    us, 6.0 * rm * rk * rn * r["groups"])
        if not self.gemms.get("bf16"):
            raise ValueError(f"{source}: a kernel table needs BF16 GEMM rows")

    def scaled(self, scale: dict[str, float], source: str) -> KernelTable:
        """This table standing for another GPU type: its rows and nearest-shape cache shared."""
        other = copy.copy(self)
        other.scale, other.source = scale, source
        return other

    def gemm_tflops(self, m: int, k: int, n: int, dtype: str = "bf16") -> float:
        """TFLOP/s of [m, k] @ [k, n]: as measured, else at the nearest measured shape."""
        rows = self.gemms.get(dtype) or self.gemms["bf16"]
        scale = self.scale[dtype if dtype in self.gemms else "bf16"]
        if (m, k, n) in rows:
            return rows[(m, k, n)] * scale
        key = (m, k, n, dtype)
        if key not in self._nearest:
            want = (max(m, 1), max(k, 1), max(n, 1))
            self._nearest[key] = rows[min(rows, key=lambda s: _log_distance(s, want))]
        return self._nearest[key] * scale

    def gemm_us(self, m: int, k: int, n: int, dtype: str = "bf16") -> float:
        return 2 * m * k * n / self.gemm_tflops(m, k, n, dtype) / 1e6

    def layer_us(self, m: int, k: int, n: int, groups: int, recipe: str) -> float | None:
        """µs of a TE layer's forward and backward ([m x groups, k] @ [k, n], `groups` GEMMs of m
        tokens) under `recipe`: as measured, else at the nearest measured shape's rate. None where
        the table has no rows of that recipe."""
        rows = self.layers.get(recipe)
        if not rows:
            return None
        key = (m, k, n, groups)
        if key in rows:
            us = rows[key][0]
        else:
            if (key, recipe) not in self._nearest:
                want = (max(m, 1), max(k, 1), max(n, 1), max(groups, 1))
                self._nearest[(key, recipe)] = rows[min(rows, key=lambda s: _log_distance(s, want))]
            near_us, near_flop = self._nearest[(key, recipe)]
            us = 6.0 * m * k * n * groups * near_us / near_flop
        return us / self.scale[precision(recipe)]

    def attention_us(self, a: Attention) -> tuple[float, float]:
        """(forward, backward) µs: as measured, else the nearest measured shape's rate at this shape's
        FLOPs."""
        key = (a.batch, a.seq, a.heads, a.groups, a.dim)
        peak = self.scale["bf16"]
        if key in self.attention:
            f, b = self.attention[key]
            return f / peak, b / peak
        if not self.attention:
            raise KeyError("no attention rows")
        if key not in self._nearest:  # the scan once a shape: plan prices thousands of layouts
            self._nearest[key] = min(self.attention, key=lambda s: _log_distance(s[1:], key[1:])
                                     + _log_distance(s[:1], key[:1]))
        near = self._nearest[key]
        scale = a.forward_flop() / Attention(*near).forward_flop()
        f, b = self.attention[near]
        return f * scale / peak, b * scale / peak


@cache
def shipped(gpu_type: str) -> KernelTable | None:
    """The reference machine's table for this GPU type, where one ships."""
    path = TABLES / f"{gpu_type}.json"
    if not path.is_file():
        return None
    return KernelTable(json.loads(path.read_text()), f"measured by moetune: kernel probe, {path.name}")


@cache
def table_for(gpu_type: str) -> KernelTable:
    """The kernel table that prices this GPU type: its own; else one measured on a GPU of the same
    tensor cores (the GPU table's generation and its BF16 and FP8 peaks: the H100 and H200 SXM share
    the GH100 die's 132 SMs and 1980 MHz; on the expert GEMM 16384 x 4096 x 3072 on random data an
    H100 ran 751 TFLOP/s (shared/device-notes.md), the H200 of H200.json 758); else the first shipped
    table at this GPU's data-sheet peaks (no GPU of the type measured: the prediction says so)."""
    own = shipped(gpu_type)
    if own:
        return own
    same = gpus.stand_ins(gpu_type, "generation", "bf16_tflops", "fp8_tflops")[1:]
    for other in same:
        table = shipped(other)
        if table:
            return table.scaled({"bf16": 1.0, "fp8": 1.0}, f"{table.source} (an {other}'s, standing for the "
                                f"{gpu_type}: the same tensor cores and peaks)")
    g, h, ref = gpus.GPUS.get(gpu_type), gpus.GPUS[REFERENCE_GPU], shipped(REFERENCE_GPU)
    if g is None or ref is None:
        raise ValueError(f"{gpu_type}: not a GPU type of the table (give one of {', '.join(gpus.GPU_TYPES)})")
    scale = {"bf16": g.bf16_tflops / h.bf16_tflops, "fp8": g.fp8_tflops / h.fp8_tflops}
    return ref.scaled(scale, f"{ref.source} at the {gpu_type}'s data-sheet peaks (BF16 x{scale['bf16']:.3g}, "
                             f"FP8 x{scale['fp8']:.3g}): no {gpu_type} measured")


def probe_shapes(layouts) -> dict:
    """The probe's input for (model, config, vocab) layouts: every distinct GEMM pass (forward, data
    and weight gradients) and attention shape, BF16 and FP8; and every layer's forward GEMM as TE runs
    it ([m, k, n, groups]: an MoE layer's local experts as one grouped layer), under each recipe."""
    gemm: set[tuple[int, int, int]] = set()
    attn: set[tuple[int, ...]] = set()
    layers: set[tuple[int, int, int, int]] = set()
    for m, c, vocab in layouts:
        gs = layer_gemms(m, c, moe=False) + layer_gemms(m, c, moe=True) + [output_gemm(m, c, vocab)]
        for g in gs:
            gemm.update(p for p in g.passes() if min(p) >= 1)
            if min(g.m, g.k, g.n) >= 1:
                layers.add((g.m, g.k, g.n, g.calls if g.kind in GROUPED_KINDS else 1))
        a = attention_shape(m, c)
        attn.add((a.batch, a.seq, a.heads, a.groups, a.dim))
    return {"gemm": [list(s) for s in sorted(gemm)], "attention": [list(s) for s in sorted(attn)],
            "dtypes": ["bf16", "fp8"], "layers": [list(s) for s in sorted(layers)], "recipes": list(RECIPES)}

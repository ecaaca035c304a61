"""The kernel probe: one GPU's speed at the exact GEMM and attention shapes of the layouts moetune
prices, measured, as one JSON record of rows (torch only, no moetune there).

    python kernel_probe.py --shapes SHAPES.json --out FILE [--min-ms 30]

SHAPES.json (made by `moetune.estimate.kernels.probe_shapes`): {"gemm": [[m, k, n], ...],
"attention": [[batch, seq, heads, groups, dim], ...], "dtypes": ["bf16", "fp8"]}. Each GEMM is
timed as written ([m, k] @ [k, n]); the caller lists a layer's forward, data-gradient and
weight-gradient shapes as separate entries. Attention is causal scaled-dot-product attention
(torch's flash kernel), forward and forward plus backward.

How: random data of a training step's scale (normal, weights at std 0.02), never zeros or
uninitialised memory (a GPU's speed depends on the bits it multiplies: zeros run faster); every
shape back to back on a GPU already warm, repeated until `--min-ms` of kernels (sustained, as in a
step, not one cold call). GPU time only: the calls are queued behind a sleeping kernel that
outlasts their queuing and timed by CUDA events around them (gpu_us), so a host slower than the
kernels (small shapes, autograd, TE's Python) adds nothing; "host_ahead" in each row says it held.
FP8 is tensorwise-scaled E4M3 through torch._scaled_mm with BF16 output, its shapes rounded up to
multiples of 16 (its rule); the casts are not in its time. Rows: {"kind": "gemm", "dtype", "m",
"k", "n", "us", "tflop_s"}, {"kind": "attention", "batch", "seq", "heads", "groups", "dim", "fwd_us",
"bwd_us", "tflop_s"} (causal FLOPs: half the score matrix), each with "host_ahead", and {"kind":
"data", ...}: one large GEMM on random data against zeros, the size of the effect the rows avoid.

With Transformer Engine importable and SHAPES.json's "layers": [[m, k, n, groups], ...] and
"recipes", each layer's forward and backward as Megatron runs it: TE's Linear (groups 1) or
GroupedLinear (an MoE layer's local experts, m tokens each) on [m x groups, k] BF16 inputs, under each
recipe ("bf16"; FP8 "delayed", "tensorwise" current scaling, "blockwise" 1x128/128x128), so the FP8
casts, amax reductions and scaled GEMMs are all in its time. Its shapes are rounded up to multiples
of 128 (blockwise's block), the same for every recipe, so recipes compare like for like. Rows:
{"kind": "layer", "recipe", "m", "k", "n", "groups", "run_as", "fwd_us", "bwd_us", "host_ahead"}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

WARMUP_MS = 2000  # a cold GPU clocks differently: the first rows would read fast or slow


def _round16(x: int) -> int:
    return (x + 15) // 16 * 16


def gpu_us(torch, fn, min_ms: float) -> tuple[float, bool]:
    """Mean µs of GPU time a call, and whether the host got ahead of the GPU: the calls are queued
    behind a sleeping kernel that outlasts their queuing, then run back to back."""
    cuda = torch.cuda
    fn(), fn()
    cuda.synchronize()
    t0 = time.perf_counter(); fn(); cuda.synchronize()  # noqa: E702
    host_ms = (time.perf_counter() - t0) * 1e3  # an upper bound on the GPU's time as well
    n = max(3, min(200, int(min_ms / max(host_ms, 1e-3))))
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    torch.cuda._sleep(int((2 * n * host_ms + 20) * SLEEP_CYCLES_PER_MS))
    start.record()
    for _ in range(n):
        fn()
    end.record()
    ahead = not start.query()  # the sleep still held the stream when the last call was queued
    cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / n, ahead


def gemm_fn(torch, m: int, k: int, n: int, dtype: str, fill: str = "random"):
    dev = "cuda"
    if dtype == "bf16":
        make = torch.zeros if fill == "zeros" else torch.randn
        a = make(m, k, device=dev, dtype=torch.bfloat16)
        b = make(k, n, device=dev, dtype=torch.bfloat16) * (0.0 if fill == "zeros" else 0.02)
        return lambda: torch.mm(a, b), (m, k, n)
    m, k, n = _round16(m), _round16(k), _round16(n)
    f8 = torch.float8_e4m3fn
    a = (torch.randn(m, k, device=dev) * 8).to(f8)
    bt = (torch.randn(n, k, device=dev) * 8).to(f8)  # _scaled_mm wants its second operand column-major
    one = torch.ones((), device=dev)
    return lambda: torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), (m, k, n)


def gemm_rows(torch, min_ms: float, shapes, dtypes) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for m, k, n in shapes:
            fn, (m2, k2, n2) = gemm_fn(torch, m, k, n, dtype)
            us, ahead = gpu_us(torch, fn, min_ms)
            rows.append({"kind": "gemm", "dtype": dtype, "m": m, "k": k, "n": n, "run_as": [m2, k2, n2],
                         "us": round(us, 3), "tflop_s": round(2 * m2 * k2 * n2 / us / 1e6, 2), "host_ahead": ahead})
            del fn
    return rows


def _attention_row(torch, min_ms: float, b: int, s: int, heads: int, groups: int, d: int) -> dict:
    import torch.nn.functional as F
    q = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, groups, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    grad = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
    gqa = {"enable_gqa": True} if groups != heads else {}

    def fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    def both():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        torch.autograd.backward(out, grad)
    (f_us, f_ahead), (fb_us, fb_ahead) = gpu_us(torch, fwd, min_ms), gpu_us(torch, both, min_ms)
    flop = 4 * b * heads * s * s * d * 0.5  # QK^T and PV, causal half
    return {"kind": "attention", "batch": b, "seq": s, "heads": heads, "groups": groups, "dim": d,
            "fwd_us": round(f_us, 2), "bwd_us": round(fb_us - f_us, 2), "tflop_s": round(3 * flop / fb_us / 1e6, 2),
            "host_ahead": f_ahead and fb_ahead}


def attention_rows(torch, min_ms: float, shapes) -> list[dict]:
    return [_attention_row(torch, min_ms, *shape) for shape in shapes]


def data_rows(torch, min_ms: float) -> list[dict]:
    """The same large GEMM on random data and on zeros."""
    m, k, n = 16384, 4096, 3072
    out = []
    for fill in ("random", "zeros"):
        fn, _ = gemm_fn(torch, m, k, n, "bf16", fill)
        us, _ = gpu_us(torch, fn, min_ms)
        out.append({"kind": "data", "fill": fill, "m": m, "k": k, "n": n, "us": round(us, 3),
                    "tflop_s": round(2 * m * k * n / us / 1e6, 2)})
    return out


# moetune.estimate.kernels.RECIPES, written out: the probe runs where moetune is not installed
RECIPES = ("bf16", "delayed", "tensorwise", "blockwise")
SLEEP_CYCLES_PER_MS = 2.0e6  # torch.cuda._sleep's unit: about a GPU clock cycle (2 GHz)


def _round128(x: int) -> int:
    return (max(x, 1) + 127) // 128 * 128


def _te_recipe(te_recipe, name: str):
    return {"delayed": te_recipe.DelayedScaling, "tensorwise": te_recipe.Float8CurrentScaling,
            "blockwise": te_recipe.Float8BlockScaling}[name]()


def _layer_row(torch, te, te_recipe, min_ms: float, m: int, k: int, n: int, groups: int, recipe: str) -> dict:
    import contextlib
    rm, rk, rn = _round128(m), _round128(k), _round128(n)
    if groups > 1:
        layer = te.GroupedLinear(groups, rk, rn, bias=False, params_dtype=torch.bfloat16, device="cuda")
        splits = [rm] * groups
        call = lambda x: layer(x, splits)  # noqa: E731
    else:
        layer = te.Linear(rk, rn, bias=False, params_dtype=torch.bfloat16, device="cuda")
        call = layer
    with torch.no_grad():
        for w in layer.parameters():
            w.normal_(0, 0.02)
    x = torch.randn(rm * groups, rk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(rm * groups, rn, device="cuda", dtype=torch.bfloat16)

    def ctx():
        if recipe == "bf16":
            return contextlib.nullcontext()
        return te.fp8_autocast(enabled=True, fp8_recipe=_te_recipe(te_recipe, recipe))

    def fwd():
        with torch.no_grad(), ctx():
            call(x)

    def both():
        with ctx():
            out = call(x)
        out.backward(grad)
    f_us, f_ahead = gpu_us(torch, fwd, min_ms)
    fb_us, fb_ahead = gpu_us(torch, both, min_ms)
    return {"kind": "layer", "recipe": recipe, "m": m, "k": k, "n": n, "groups": groups,
            "run_as": [rm, rk, rn], "fwd_us": round(f_us, 2), "bwd_us": round(fb_us - f_us, 2),
            "host_ahead": f_ahead and fb_ahead}


def layer_rows(torch, min_ms: float, shapes, recipes, log=None) -> list[dict]:
    """Every layer shape under every recipe TE runs here; none without TE (one line to `log`)."""
    try:
        import transformer_engine.common.recipe as te_recipe
        import transformer_engine.pytorch as te
    except Exception as e:  # an image without TE: the GEMM rows still stand
        print(f"kernel_probe: no layer rows: Transformer Engine: {e}", file=log or sys.stderr)
        return []
    rows = []
    for recipe in recipes:
        for m, k, n, groups in shapes:
            try:
                rows.append(_layer_row(torch, te, te_recipe, min_ms, m, k, n, groups, recipe))
            except Exception as e:  # a recipe this GPU or TE refuses: said once a row, the rest go on
                rows.append({"kind": "layer", "recipe": recipe, "m": m, "k": k, "n": n, "groups": groups,
                             "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
            torch.cuda.empty_cache()
    return rows


def warm(torch) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.monotonic()
    while (time.monotonic() - t0) * 1e3 < WARMUP_MS:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--min-ms", type=float, default=30.0)
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("kernel_probe: no GPU", file=sys.stderr)
        return 2
    spec = json.load(open(a.shapes))
    torch.backends.cuda.matmul.allow_tf32 = False
    warm(torch)
    t0 = time.monotonic()
    rows = data_rows(torch, a.min_ms)
    rows += gemm_rows(torch, a.min_ms, spec.get("gemm", []), spec.get("dtypes", ["bf16"]))
    rows += attention_rows(torch, a.min_ms, spec.get("attention", []))
    rows += layer_rows(torch, a.min_ms, spec.get("layers", []), spec.get("recipes", RECIPES))
    props = torch.cuda.get_device_properties(0)
    record = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
              "min_ms": a.min_ms, "seconds": round(time.monotonic() - t0, 1), "rows": rows}
    with open(a.out, "w") as f:
        json.dump(record, f, indent=0)
    print(f"kernel_probe: {len(rows)} rows in {record['seconds']} s on {props.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A first check that Transformer Engine works on the GPU machine: a Linear and a GroupedLinear
forward and backward in BF16, and the Linear again under FP8 with the blockwise recipe.
Prints one line per part and exits non-zero on the first failure."""
import sys
import time

import torch
import transformer_engine
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import Float8BlockScaling


def part(name, fn):
    t0 = time.time()
    try:
        fn()
        torch.cuda.synchronize()
    except Exception as e:  # the exact error is what the benchmark notes need
        print(f"te: {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        sys.exit(1)
    print(f"te: {name}: ok ({time.time() - t0:.1f} s)")


x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
lin = te.Linear(1024, 1024, params_dtype=torch.bfloat16).cuda()
grouped = te.GroupedLinear(4, 1024, 1024, params_dtype=torch.bfloat16).cuda()
print("te:", transformer_engine.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
part("Linear bf16", lambda: lin(x).sum().backward())
part("GroupedLinear bf16", lambda: grouped(x, [128] * 4).sum().backward())


def fp8():
    with te.fp8_autocast(enabled=True, fp8_recipe=Float8BlockScaling()):
        y = lin(x)
    y.sum().backward()


part("Linear fp8 blockwise", fp8)

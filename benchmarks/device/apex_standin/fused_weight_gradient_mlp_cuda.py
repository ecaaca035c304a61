"""A stand-in for apex's fused_weight_gradient_mlp_cuda extension, which the GPU machine's image
lacks (apex is not built there). Megatron's own linear layers (the output layer; the rest of the
model is Transformer Engine's, which accumulates its weight gradients itself) call it when
--gradient-accumulation-fusion is on: main_grad += grad_output^T @ input. Apex does that in one
GEMM; this takes a GEMM and an add, on one layer, so a run's launches differ from apex's by one a
micro-batch. Used only by benchmarks/device/host_cost.sh, to count launches with the fusion on."""
import torch


def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    main_grad.add_(torch.matmul(grad_output.t(), total_input))


wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32

"""CODA: LLaMA-block ops fused into GEMM epilogues on NVIDIA Hopper (sm_90), for PyTorch.

coda.ops      functional ops with autograd (torch.library custom ops: torch.compile(fullgraph=True) traces them)
coda.nn       modules (RMSNormLinear, SwiGLUMLP, LlamaBlock, LinearCrossEntropyLoss)
coda.layout   weight layout conversions between Hugging Face and CODA
coda.patch_llama(model)  switches a transformers LlamaForCausalLM to CODA kernels in place (patch_qwen3: Qwen3)

CUDA tensors run the kernels of libcoda (loaded with ctypes; no torch C++ extension); CPU tensors run the float64
PyTorch reference of the same math.
"""
from . import layout, models, nn, ops  # ops defines the torch.ops.coda operators
from ._C import available, device_supported
from .hf import patch_llama, patch_qwen3, unpatch_llama, unpatch_qwen3

__version__ = "0.1.0"

__all__ = ["ops", "layout", "nn", "models", "patch_llama", "unpatch_llama", "patch_qwen3", "unpatch_qwen3",
           "available", "device_supported", "__version__"]

"""The peak FLOP/s of a GPU, for the model FLOPs utilisation (MFU) that throughput.Throughput logs as `perf/mfu`:
the share of the peak that training turns into model FLOPs, the figure that says how much faster the same hardware
could go.

Peaks are dense tensor-core peaks, as MFU is quoted. Depends on torch and lightning only.
"""

import torch
from lightning.fabric.utilities.throughput import get_available_flops

# NVIDIA's datasheet peaks without sparsity for Hopper SXM (H100 and H200 share the chip). Lightning's table has the
# H100 SXM right, but gives the H200 the sparse peak and does not recognise the name "NVIDIA H200" at all.
HOPPER_SXM_DENSE = {torch.bfloat16: 989e12, torch.float16: 989e12, "tfloat32": 495e12, torch.float32: 67e12}

MATMUL_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense peak FLOP/s for the matmuls of `precision` (a Trainer precision such as "bf16-mixed");
    None off CUDA, or for a GPU that neither table knows."""
    if device.type != "cuda":
        return None
    dtype = MATMUL_DTYPES.get(precision.split("-")[0], torch.float32)
    name = torch.cuda.get_device_name(device).lower()
    if ("h100" in name or "h200" in name) and "nvl" not in name and "pcie" not in name:
        tf32 = dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest"
        return HOPPER_SXM_DENSE.get("tfloat32" if tf32 else dtype)
    return get_available_flops(device, dtype)

"""Peak FLOP/s of a device, for MFU: a table for current NVIDIA GPUs and TPUs, a CPU measured.

Figures are dense (no structured sparsity), per device, in TFLOP/s, from each vendor's
datasheet (the source is beside each row; where a datasheet gives only the sparse figure,
marked `*` there, the dense one is half of it). A device or a precision the table does not
hold has no peak: its MFU is not available, with the reason (`lookup`), never a guess. On
a CPU, the peak is measured once per process by a float32 matrix product (`cpu_peak_tflops`).

Precisions: `"fp32"` (no tensor cores), `"tf32"` (float32 matmuls on tensor cores, what
TensorFlow and JAX do by default on Ampere and later GPUs, and torch with
`torch.set_float32_matmul_precision("high")`), `"bf16"`, `"fp16"`, `"fp8"`.
"""

from __future__ import annotations

import re
import time
from typing import NamedTuple

import numpy as np


class Peak(NamedTuple):
    """One device model's dense peaks, TFLOP/s by precision, and where they come from."""

    pattern: str
    label: str
    tflops: dict[str, float]
    source: str


_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_GH200 = "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip"
_B200 = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, 8 GPUs: divided by 8)"
_TPU = "https://cloud.google.com/tpu/docs/system-architecture-tpu-vm (per chip)"

#: Checked in order: the first pattern that matches the device's name gives its peaks.
PEAKS: tuple[Peak, ...] = (
    # HGX B200, 8 GPUs: FP32 600 TF; TF32 18, BF16/FP16 36, FP8 72 PFLOPS* (sparse).
    Peak(r"\bB200\b", "NVIDIA B200",
         {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}, _B200),
    # GH200: FP32 67; TF32 494 | 989*; BF16/FP16 990 | 1979*; FP8 1979 | 3958*.
    Peak(r"\bGH200\b", "NVIDIA GH200",
         {"fp32": 67.0, "tf32": 494.0, "bf16": 990.0, "fp16": 990.0, "fp8": 1979.0}, _GH200),
    # H200 NVL: FP32 60; TF32 835*; BF16/FP16 1671*; FP8 3341*.
    Peak(r"\bH200\b.*\bNVL\b", "NVIDIA H200 NVL",
         {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, _H200),
    # H200 SXM: FP32 67; TF32 989*; BF16/FP16 1979*; FP8 3958*.
    Peak(r"\bH200\b", "NVIDIA H200 SXM",
         {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}, _H200),
    # H100 NVL: FP32 60; TF32 835*; BF16/FP16 1671*; FP8 3341*.
    Peak(r"\bH100\b.*\bNVL\b", "NVIDIA H100 NVL",
         {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, _H100),
    # H100 PCIe: FP32 51; TF32 756*; BF16/FP16 1513*; FP8 3026*.
    Peak(r"\bH100\b.*\bPCIe\b", "NVIDIA H100 PCIe",
         {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0}, _H100),
    # H100 SXM: FP32 67; TF32 989*; BF16/FP16 1979*; FP8 3958*.
    Peak(r"\bH100\b", "NVIDIA H100 SXM",
         {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}, _H100),
    # A100 (SXM and PCIe, 40 and 80 GB): FP32 19.5; TF32 156 | 312*; BF16/FP16 312 | 624*.
    Peak(r"\bA100\b", "NVIDIA A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
         _A100),
    # L40S: FP32 91.6; TF32 183 | 366*; BF16/FP16 362.05 | 733*; FP8 733 | 1466*.
    Peak(r"\bL40S\b", "NVIDIA L40S",
         {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
         "https://www.nvidia.com/en-us/data-center/l40s/"),
    # L40: FP32 90.5; TF32 90.5 | 181*; BF16/FP16 181.05 | 362.1*; FP8 362 | 724*.
    Peak(r"\bL40\b", "NVIDIA L40",
         {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0},
         "https://www.nvidia.com/en-us/data-center/l40/"),
    # L4: FP32 30.3; TF32 120*; BF16/FP16 242*; FP8 485*.
    Peak(r"\bL4\b", "NVIDIA L4",
         {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
         "https://www.nvidia.com/en-us/data-center/l4/"),
    # A10: FP32 31.2; TF32 62.5 | 125*; BF16/FP16 125 | 250*.
    Peak(r"\bA10\b", "NVIDIA A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
         "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    # V100 PCIe: FP32 14; FP16 tensor 112 (no TF32, no BF16).
    Peak(r"\bV100\b.*\bPCIE\b", "NVIDIA V100 PCIe", {"fp32": 14.0, "fp16": 112.0},
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    # V100 SXM2: FP32 15.7; FP16 tensor 125.
    Peak(r"\bV100\b", "NVIDIA V100 SXM2", {"fp32": 15.7, "fp16": 125.0},
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    # T4: FP32 8.1; FP16 (mixed) 65.
    Peak(r"\bT4\b", "NVIDIA T4", {"fp32": 8.1, "fp16": 65.0},
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    # TPUs: bf16 per chip; XLA's default precision runs float32 matmuls as one bf16 pass.
    Peak(r"\bTPU v6 ?(lite|e)\b", "TPU v6e", {"bf16": 918.0, "fp32": 918.0}, _TPU),
    Peak(r"\bTPU v5 ?(lite|e)\b", "TPU v5e", {"bf16": 197.0, "fp32": 197.0}, _TPU),
    Peak(r"\bTPU v5p?\b", "TPU v5p", {"bf16": 459.0, "fp32": 459.0}, _TPU),
    Peak(r"\bTPU v4\b", "TPU v4", {"bf16": 275.0, "fp32": 275.0}, _TPU),
)

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


def precision(compute_dtype: str, float32_on_tensor_cores: bool) -> str:
    """The peak's precision for a model computing in `compute_dtype` (Keras's policy)."""
    name = str(compute_dtype)
    if "float8" in name:
        return "fp8"
    if "bfloat16" in name:
        return "bf16"
    if "float16" in name:
        return "fp16"
    return "tf32" if float32_on_tensor_cores else "fp32"


def lookup(device: str, precision: str) -> tuple[float | None, str]:
    """`(peak TFLOP/s, what it is)` of one `device` (its name, e.g. `"NVIDIA H100 80GB HBM3"`,
    `"TPU v5 lite"`) at `precision`; `(None, why not)` where the table has none."""
    for peak in PEAKS:
        if re.search(peak.pattern, device, re.IGNORECASE):
            value = peak.tflops.get(precision)
            if value is None:
                return None, (f"{peak.label} has no {precision} peak in kmp's table (it "
                              f"holds {', '.join(sorted(peak.tflops))})")
            return value, f"{peak.label} {precision} dense peak ({peak.source})"
    return None, f"no peak known for {device!r} in kmp's table"


_cpu: list[float] = []


def cpu_peak_tflops(size: int = 1024, repeats: int = 5) -> float:
    """This process's float32 matmul throughput on the CPU, measured once per process: the
    best of `repeats` products of two `size` x `size` matrices, by the active Keras backend
    (`keras.ops.matmul`: the library and threads the model's own products use) or NumPy's
    BLAS, whichever is faster."""
    if not _cpu:
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
        best = _best(lambda: np.matmul(a, b), repeats)
        try:
            import keras

            ka, kb = keras.ops.convert_to_tensor(a), keras.ops.convert_to_tensor(b)
            best = min(best, _best(lambda: keras.ops.convert_to_numpy(keras.ops.matmul(ka, kb)),
                                   repeats))
        except Exception:  # noqa: BLE001 - NumPy's figure stands
            pass
        _cpu.append(2.0 * size**3 / best / 1e12)
    return _cpu[0]


def _best(product: object, repeats: int) -> float:
    """The shortest of `repeats` timed calls of `product` (after one warm-up call)."""
    product()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product()
        times.append(time.perf_counter() - start)
    return max(min(times), 1e-9)

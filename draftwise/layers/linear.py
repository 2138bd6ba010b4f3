"""Linear layers for CPU bf16 and fp32 with several kernels, chosen per row count.

``PackedLinear`` keeps the weight in the forms its candidate kernels need and
runs, for a call with ``n`` rows, the kernel its plan names for ``n``:

* bf16: ``packed`` (oneDNN-reordered weight, ``mkldnn._linear_pointwise``: AMX or
  AVX512-BF16 where the CPU has them), ``linear`` (``F.linear``), ``mv``
  (``torch.mv``, one row only).
* fp32: ``matmul_t`` (``x @ W^T`` with ``W^T`` stored contiguous) and ``packed``.

No kernel wins everywhere: which of one-row bf16 ``torch.mv`` and ``packed`` is
faster depends on whether the CPU has native bf16 (AVX512-BF16, AMX), and MKL's
fp32 GEMM is very slow for a few rows on CPUs it does not tune for.
So the plan is measured on the machine at start-up (``kernel_choice.py``);
until then (and for modules nobody measured) ``DEFAULT_PLANS`` applies.
``pack_linears`` swaps every ``nn.Linear`` of a model for a ``PackedLinear``
when it applies (CPU, bf16 or fp32, oneDNN available); elsewhere the model is
left as is. In a compiled forward a ``PackedLinear`` is the opaque
``draftwise::packed_linear`` op on its prepacked weight (the ``packed`` kernel
at every row count): inductor fuses what lies between the linears and needs
no weight freezing, which would also keep its compiled graphs out of the
on-disk cache (``compilation/compiled_forward.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import native

CANDIDATES = {torch.bfloat16: ("packed", "linear", "mv"), torch.float32: ("matmul_t", "packed")}
DEFAULT_PLANS = {torch.bfloat16: {1: "mv", 2: "packed"}, torch.float32: {2: "matmul_t", 3: "packed"}}


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype in (torch.bfloat16, torch.float32)
            and torch.backends.mkldnn.is_available()
            and (dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def plan_by_rows(plan: dict[int, str]) -> list[str]:
    """``{bucket: kernel}`` -> a list indexed by row count up to the largest bucket: each row
    count takes the kernel of the smallest bucket that holds it (the largest beyond)."""
    buckets = sorted(plan)
    return [plan[next(b for b in buckets if b >= rows)] for rows in range(buckets[-1] + 1)]


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor,  # [out_features, in_features]
                 bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.bias = bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)
        self.weight_t = None  # fp32: [in_features, out_features]
        if weight.dtype == torch.float32:
            self.weight_t = weight.t().contiguous()
            self.weight = self.weight_t.t()  # a view: no second copy
        else:
            self.weight = weight.contiguous()
        self.set_plan(DEFAULT_PLANS[self.dtype])
        # Inside a compiled graph: the C++ op where it built (no Python call per linear), else ours below.
        self._compiled_op = (torch.ops.draftwise_cpu.packed_linear if native.load()
                             else torch.ops.draftwise.packed_linear)

    def set_plan(self, plan: dict[int, str]) -> None:
        """``plan``: row bucket -> kernel name (one of ``CANDIDATES[dtype]``)."""
        bad = set(plan.values()) - set(CANDIDATES[self.dtype])
        if bad or any(kernel == "mv" and bucket != 1 for bucket, kernel in plan.items()):
            raise ValueError(f"kernel plan {plan} is invalid for {self.dtype}; kernels: {CANDIDATES[self.dtype]}")
        self.plan = dict(plan)
        self._by_rows = plan_by_rows(plan)
        self._cap = len(self._by_rows) - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_rows, in] -> [num_rows, out]
        if torch.compiler.is_compiling():
            return self._compiled_op(x, self.packed, self.bias)
        return self.run(self._by_rows[min(x.shape[0], self._cap)], x)

    def run(self, kernel: str, x: torch.Tensor) -> torch.Tensor:  # [num_rows, in] -> [num_rows, out]
        if kernel == "packed":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if kernel == "linear":
            return F.linear(x, self.weight, self.bias)
        out = torch.mv(self.weight, x[0]).unsqueeze(0) if kernel == "mv" else x @ self.weight_t
        return out if self.bias is None else out + self.bias


@torch.library.custom_op("draftwise::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor,  # [num_rows, in_features]
                  packed: torch.Tensor,  # oneDNN-reordered [out_features, in_features]
                  bias: torch.Tensor | None) -> torch.Tensor:  # [num_rows, out_features]
    """A ``PackedLinear``'s ``packed`` kernel as one op a compiled graph calls as is."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


packed_linear.register_fake(native.packed_linear_fake)


def pack_linears(model: nn.Module) -> None:
    """Replace each nn.Linear child (recursively) by a PackedLinear, in place."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, PackedLinear(child.weight.data, None if child.bias is None else child.bias.data))
        else:
            pack_linears(child)

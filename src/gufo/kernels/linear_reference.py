"""Torch reference for the quantized linear op: dequantize once, multiply in float32."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from gufo.formats import dequantize
from gufo.gguf.model_file import TensorInfo
from gufo.kernels.contracts import EXPERT_LINEAR, LINEAR, ExpertLinearKernel, LinearKernel
from gufo.kernels.expert_groups import ExpertGroups, per_expert
from gufo.kernels.registry import REFERENCE_BACKEND, Registration


def raw_rows(info: TensorInfo) -> torch.Tensor:
    """The tensor's GGUF rows as a uint8 torch view of the map [rows, row_bytes] (no copy)."""
    with warnings.catch_warnings():  # read-only memmap: nothing writes into the file's bytes
        warnings.simplefilter("ignore", UserWarning)
        return torch.as_tensor(np.asarray(info.data)).reshape(-1, info.data.shape[-1])


def dequantize_tensor(info: TensorInfo, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 values of a 2-D GGUF tensor (or of the selected rows only)."""
    raw = info.data.reshape(-1, info.data.shape[-1])
    if rows is not None:
        raw = raw[rows.numpy()]
    return dequantize(info.qtype, raw, info.shape[-1])


class ReferenceLinear(LinearKernel):
    """y = x @ W^T with W dequantized to float32 at load."""

    name = "torch-dequant-f32"

    @staticmethod
    def prepare(info: TensorInfo) -> torch.Tensor:
        return dequantize_tensor(info)

    @staticmethod
    def apply(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight.T


class DeviceDequantLinear(LinearKernel):
    """GPU fallback for block formats without a Triton kernel: the raw GGUF rows live on the device and
    are dequantized there for every product (correct, not fast)."""

    name = "torch-dequant-on-device"

    @staticmethod
    def prepare(info: TensorInfo) -> tuple[TensorInfo, torch.Tensor]:
        return info, raw_rows(info).to(torch.device("cuda", torch.cuda.current_device()))

    @staticmethod
    def apply(x: torch.Tensor, weight: tuple[TensorInfo, torch.Tensor]) -> torch.Tensor:
        info, raw = weight
        return x @ dequantize(info.qtype, raw, info.shape[-1]).to(x.dtype).T


class ReferenceExpertLinear(ExpertLinearKernel):
    """Expert products on the 3-D expert tensor dequantized to float32 at load: the chosen experts'
    matrices gathered by their ids on the device (index_select, then one batched product)."""

    name = "torch-experts-f32"

    @staticmethod
    def prepare(info: TensorInfo) -> torch.Tensor:
        return dequantize_tensor(info).reshape(info.shape)

    @staticmethod
    def gathered(x: torch.Tensor, weight: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        rows = x.expand(experts.shape[0], -1)
        return torch.bmm(weight.index_select(0, experts), rows[:, :, None])[..., 0]

    @staticmethod
    def grouped(x: torch.Tensor, weight: torch.Tensor, groups: ExpertGroups) -> torch.Tensor:
        parts = [part @ weight[e].T for e, part in per_expert(x, groups)]
        return torch.cat(parts) if parts else x.new_empty(0, weight.shape[1])


KERNELS = (
    Registration(REFERENCE_BACKEND, LINEAR, ReferenceLinear()),
    Registration(REFERENCE_BACKEND, EXPERT_LINEAR, ReferenceExpertLinear()),
    Registration("cuda", LINEAR, DeviceDequantLinear()),
)

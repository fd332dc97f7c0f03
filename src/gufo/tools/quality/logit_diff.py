"""Differences between two full-vocabulary logit vectors, accumulated in float64."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class LogitDiff:
    max_abs_diff: float
    mean_abs_diff: float
    rmse: float
    cosine: float
    reference_top1: int
    candidate_top1: int
    finite: bool
    reference_margin: float  # the reference's top-1 logit minus its runner-up: how near a tie it is

    @property
    def top1_match(self) -> bool:
        return self.reference_top1 == self.candidate_top1

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "top1_match": self.top1_match}


def compare_logits(reference: torch.Tensor, candidate: torch.Tensor) -> LogitDiff:
    ref = reference.detach().to("cpu", torch.float64).reshape(-1)
    cand = candidate.detach().to("cpu", torch.float64).reshape(-1)
    if ref.shape != cand.shape:
        raise ValueError(f"logit vectors differ in length: {ref.numel()} vs {cand.numel()}")
    finite = bool(torch.isfinite(ref).all() and torch.isfinite(cand).all())
    diff = (ref - cand).abs()
    top = ref.topk(min(2, ref.numel())).values
    return LogitDiff(
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        rmse=float(diff.square().mean().sqrt()),
        cosine=float(torch.nn.functional.cosine_similarity(ref, cand, dim=0)),
        reference_top1=int(ref.argmax()),
        candidate_top1=int(cand.argmax()),
        finite=finite,
        reference_margin=float(top[0] - top[1]) if len(top) == 2 else 0.0,
    )

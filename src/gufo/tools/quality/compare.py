"""Distribution-level comparison of a candidate run with reference logits (llama-perplexity's
--kl-divergence statistics), in float64.

KL(reference || candidate) per position. When the reference kept only its top-K logits, the rest of
the vocabulary is one "other" bucket on both sides: the KL of that coarser distribution, exact for
full rows and otherwise a lower bound (close to the true value when the top-K holds most of the mass).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from gufo.tools.quality.reference import ReferenceLogits, log_sum_exp


@dataclass(frozen=True)
class QualityReport:
    positions: int
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_max: float
    top1_agreement: float  # fraction of positions whose argmax tokens agree
    rms_dp: float  # RMS over positions of candidate minus reference probability of the actual next token
    reference_ppl: float
    candidate_ppl: float
    nonfinite_reference: int  # positions whose row has a non-finite value (left out of the statistics)
    nonfinite_candidate: int
    full_vocabulary: bool

    def lines(self) -> list[str]:
        scope = "full vocabulary" if self.full_vocabulary else "top-K + rest"
        return [
            f"[Quality] positions={self.positions} ({scope}) kl_mean={self.kl_mean:.6g} "
            f"kl_median={self.kl_median:.6g} kl_p99={self.kl_p99:.6g} kl_max={self.kl_max:.6g}",
            f"[Quality] top1={100 * self.top1_agreement:.3f}% rms_dp={100 * self.rms_dp:.4f}% "
            f"ppl_reference={self.reference_ppl:.4f} ppl_candidate={self.candidate_ppl:.4f} "
            f"nonfinite_reference={self.nonfinite_reference} nonfinite_candidate={self.nonfinite_candidate}",
        ]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def kl_divergence(reference: ReferenceLogits, candidate: torch.Tensor) -> torch.Tensor:
    """KL(reference || candidate) per stored position; candidate: full logit rows [P, vocab]."""
    candidate = candidate.double()
    # the same log-sum-exp as the recorded one, so a run compared with itself gives exactly 0
    log_q = candidate - log_sum_exp(candidate)[:, None]
    log_p = torch.from_numpy(reference.logits).double() - torch.from_numpy(reference.lse).double()[:, None]
    if reference.full:
        return (log_p.exp() * (log_p - log_q)).sum(-1)
    log_q_kept = log_q.gather(1, torch.from_numpy(reference.ids).long())
    p_kept = log_p.exp()
    kl = (p_kept * (log_p - log_q_kept)).sum(-1)
    p_rest = (1.0 - p_kept.sum(-1)).clamp_min(0.0)
    q_rest = (1.0 - log_q_kept.exp().sum(-1)).clamp_min(torch.finfo(torch.float64).tiny)
    rest = torch.where(p_rest > 0, p_rest * (p_rest.clamp_min(1e-300).log() - q_rest.log()), 0.0)
    return kl + rest


def compare_to_reference(reference: ReferenceLogits, candidate: torch.Tensor) -> QualityReport:
    candidate = candidate.double()
    ref_rows = torch.from_numpy(reference.logits).double()
    ref_ok = torch.isfinite(ref_rows).all(-1) & torch.isfinite(torch.from_numpy(reference.lse))
    cand_ok = torch.isfinite(candidate).all(-1)
    ok = ref_ok & cand_ok
    kl = kl_divergence(reference, candidate)[ok]
    ref_top1 = ref_rows.argmax(-1) if reference.full else torch.from_numpy(reference.ids[:, 0]).long()
    agree = (ref_top1 == candidate.argmax(-1))[ok]
    # perplexity and delta-p over positions whose next token is known
    next_logit = torch.from_numpy(reference.next_logit).double()
    scored = ok & torch.isfinite(next_logit)
    tokens = torch.from_numpy(reference.tokens)
    following = torch.from_numpy(reference.positions)[scored] + 1
    # log p(next) = its logit - the row's log-sum-exp on both sides, the reference's as it was recorded
    # (log_softmax rounds differently: a run against itself then differed in the perplexity's last digits)
    ref_logp = (next_logit - torch.from_numpy(reference.lse).double())[scored]
    cand_rows = candidate[scored]
    cand_logp = cand_rows.gather(1, tokens[following][:, None].long())[:, 0] - log_sum_exp(cand_rows)

    def mean(values: torch.Tensor) -> float:
        """Correctly rounded (math.fsum): the same bits whatever the order, length or thread count."""
        return math.fsum(values.tolist()) / values.numel() if values.numel() else math.nan

    return QualityReport(
        positions=len(reference.positions),
        kl_mean=mean(kl),
        kl_median=float(kl.median()) if kl.numel() else math.nan,
        kl_p99=float(torch.quantile(kl, 0.99)) if kl.numel() else math.nan,
        kl_max=float(kl.max()) if kl.numel() else math.nan,
        top1_agreement=mean(agree.double()),
        rms_dp=math.sqrt(mean((cand_logp.exp() - ref_logp.exp()).square())),
        reference_ppl=math.exp(-mean(ref_logp)),
        candidate_ppl=math.exp(-mean(cand_logp)),
        nonfinite_reference=int((~ref_ok).sum()),
        nonfinite_candidate=int((~cand_ok).sum()),
        full_vocabulary=reference.full,
    )

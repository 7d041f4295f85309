"""Training objectives, one home for every method: each a small ``nn.Module`` whose docstring
says what it pulls together and what it pushes apart. Each is tested against its reference
definition (sentence-transformers' loss of the same name where one exists; the plain formula
otherwise) in ``tests/test_losses.py``.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def cos_sim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[len(a), len(b)] cosine similarities, in float32 under autocast too: autocast runs a
    matrix product in bf16 even on float32 inputs, and a bf16 cosine near 1 moves in steps of
    2^-8, 0.08 in a logit at MNRL's scale of 20 (the losses' docstrings promise float32)."""
    with _no_autocast(a):
        a, b = (x.to(torch.promote_types(x.dtype, torch.float32)) for x in (a, b))
        return nn.functional.normalize(a, dim=-1) @ nn.functional.normalize(b, dim=-1).T


def _no_autocast(tensor: torch.Tensor):
    """Autocast off for ``tensor``'s device type (a no-op context where it has none: meta)."""
    kind = tensor.device.type
    return torch.autocast(kind, enabled=False) if torch.amp.is_autocast_available(kind) else contextlib.nullcontext()


class MultipleNegativesRankingLoss(nn.Module):
    """MNRL (Henderson et al. 2017; sentence-transformers' loss of the same name).

    Pulls each anchor towards its own positive and pushes it away from every other candidate in
    the batch: the other pairs' positives (in-batch negatives) and every hard negative present.
    Cross-entropy over ``scale * cos(anchor_i, candidate_j)``, target j = i (``scale`` is the
    inverse temperature: 20 is 0.05). Pairs without a hard negative simply contribute no extra
    candidate (``negatives`` may hold fewer rows than the batch; with all or none present this
    is sentence-transformers' loss exactly).
    """

    def __init__(self, scale: float = 20.0):
        super().__init__()
        self.scale = scale

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor,
                negatives: torch.Tensor | None = None) -> torch.Tensor:
        candidates = positives
        if negatives is not None and len(negatives):
            candidates = torch.cat([positives, negatives])
        scores = self.scale * cos_sim(anchors, candidates)
        target = torch.arange(len(anchors), device=anchors.device)
        return nn.functional.cross_entropy(scores.float(), target)


class CosineSimilarityLoss(nn.Module):
    """sentence-transformers' CosineSimilarityLoss: the mean squared error between cos(u_i, v_i)
    and a label (default 1). With label 1 it pulls each pair together; it pushes nothing apart,
    so alone it can collapse a space (the CLA's pl adapter trains against a frozen side)."""

    def forward(self, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor | float = 1.0) -> torch.Tensor:
        cos = nn.functional.cosine_similarity(u.float(), v.float(), dim=-1)
        labels = torch.as_tensor(labels, dtype=cos.dtype, device=cos.device).expand_as(cos)
        return nn.functional.mse_loss(cos, labels)


def mlm_parts(model) -> tuple[nn.Module, nn.Module]:
    """(encoder, MLM head) of a ``*ForMaskedLM`` model, through a PEFT wrapper if there is one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    encoder = getattr(inner, inner.base_model_prefix)
    head = getattr(inner, "cls", None) or getattr(inner, "lm_head", None)
    if head is None:
        raise TypeError(f"{type(inner).__name__} has no MLM head (cls or lm_head)")
    return encoder, head


def masked_positions(states: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``states[labels != -100]``, ``labels[labels != -100]``), the positions found where
    ``labels`` are: on the CPU the host never waits for the GPU (a boolean index of GPU tensors
    would wait for ``states``), and the index and targets go to the GPU without blocking."""
    from modsent.training.loop import to_device

    flat = labels.reshape(-1)
    positions = (flat != -100).nonzero().squeeze(1)  # row-major, as states[labels != -100]
    targets = to_device(flat.index_select(0, positions), states.device)
    return states.reshape(-1, states.shape[-1]).index_select(0, to_device(positions, states.device)), targets


class MaskedLanguageModelingLoss(nn.Module):
    """Masked language modelling: cross-entropy of the original token at every masked position
    (label != -100), pulling the model's prediction there towards the token that was hidden.

    The MLM head (the vocabulary projection, the most expensive layer) is applied to the masked
    positions only: 85% of a full-sequence head's outputs would be thrown away. Equal to
    transformers' ``*ForMaskedLM`` loss over the same labels. ``reduction="sum"`` sums instead of
    averaging over the masked positions (data-parallel training divides by the global count).

    The masked positions are found where ``labels`` are: give them on the CPU (the LA does) and
    the GPU is never waited for in the step; a boolean index on GPU tensors would make the host
    wait for the encoder's forward before it could queue the head and the backward."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.reduction = reduction

    def forward(self, model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from modsent.training import fastpath

        encoder, head = mlm_parts(model)
        selected, targets = masked_positions(encoder(input_ids=input_ids).last_hidden_state, labels)
        # F.cross_entropy of the logits in fp32, or the same through a Triton kernel (fuse_cross_entropy)
        return fastpath.mlm_cross_entropy(head, head(selected), targets, self.reduction)



class TripletInfoNCELoss(nn.Module):
    """SimCSE's supervised objective over (anchor, positive, hard negative) triplets (Gao et al.
    2021; mSimCSE; m-ST5):

        l_i = -log e^{cos(h_i, h_i+)/t} / sum_j (e^{cos(h_i, h_j+)/t} + e^{cos(h_i, h_j-)/t})

    Pulls each anchor towards its own positive and pushes it away from every other positive in
    the batch and from every triplet's hard negative, its own included; ``t`` is the
    temperature (0.05 in SimCSE's and mSimCSE's scripts). With every triplet's negative present
    it is :class:`MultipleNegativesRankingLoss` with ``scale = 1 / t``; it differs in insisting on
    triplets: ``negatives`` holds one row per anchor, or is None (in-batch negatives only). The
    similarities are computed in float32 whatever the embeddings' dtype.
    """

    def __init__(self, temperature: float = 0.05):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor,
                negatives: torch.Tensor | None = None) -> torch.Tensor:
        if len(positives) != len(anchors) or (negatives is not None and len(negatives) != len(anchors)):
            raise ValueError(f"one positive and one negative per anchor: {len(anchors)} anchors, "
                             f"{len(positives)} positives, {None if negatives is None else len(negatives)} negatives")
        candidates = positives if negatives is None else torch.cat([positives, negatives])
        scores = cos_sim(anchors.float(), candidates.float()) / self.temperature
        target = torch.arange(len(anchors), device=anchors.device)
        return nn.functional.cross_entropy(scores, target)


class KoLeoLoss(nn.Module):
    """The Kozachenko-Leonenko entropy estimator as a regulariser (Sablayrolles et al. 2019;
    DINOv2; MEXMA), on L2-normalised vectors x_1..x_n of one batch:

        KoLeo(X) = -(1/n) sum_i log(min_{j != i} ||x_i - x_j||_2 + eps)

    Pushes every vector away from its nearest neighbour in the batch, so the vectors spread over
    the sphere (the mean pairwise cosine falls); it pulls nothing together. Computed in float32;
    the nearest neighbour is found without gradient (the largest dot product), the distance to
    it carries the gradient. ``n`` must be at least 2."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        if len(vectors) < 2:
            raise ValueError(f"KoLeo needs at least 2 vectors (a nearest neighbour), got {len(vectors)}")
        x = nn.functional.normalize(vectors.float(), dim=-1, eps=self.eps)
        with torch.no_grad(), _no_autocast(x):  # the nearest in float32
            dots = x @ x.T
            dots.fill_diagonal_(-float("inf"))
            nearest = dots.argmax(dim=1)
        distances = torch.linalg.vector_norm(x - x[nearest], dim=-1)
        return -torch.log(distances + self.eps).mean()


class SymmetricInfoNCELoss(nn.Module):
    """InfoNCE in both directions over aligned pairs (a_i, b_i) with in-batch negatives:

        (1/2) [ CE_i(cos(a_i, b_.) / t, i) + CE_i(cos(b_i, a_.) / t, i) ]

    Pulls each pair together and pushes every a_i away from the other pairs' b_j and every b_i
    from the other a_j (MEXMA's contrastive variant; = (MNRL(a, b) + MNRL(b, a)) / 2 with scale
    1/t). Similarities in float32."""

    def __init__(self, temperature: float = 0.05):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if len(a) != len(b):
            raise ValueError(f"one b per a: {len(a)} and {len(b)}")
        scores = cos_sim(a.float(), b.float()) / self.temperature
        target = torch.arange(len(a), device=a.device)
        return (nn.functional.cross_entropy(scores, target) + nn.functional.cross_entropy(scores.T, target)) / 2


class CrossUnmaskingLoss(nn.Module):
    """MEXMA's token-level objective: cross-entropy of the original token at every masked
    position (label != -100) of the unmasking head's output states, through the vocabulary
    projection ``logits(states) -> [.., vocab]`` (tied to the word embeddings). The head saw the
    masked sentence with its position 0 replaced by the *other* language's clean sentence
    vector, so restoring the tokens pulls that vector towards carrying the sentence's content.
    The projection runs on the masked positions only. ``reduction="sum"``: summed over the
    positions (a data-parallel trainer divides by the global count). As in
    :class:`MaskedLanguageModelingLoss`, the masked positions are found where ``labels`` are:
    MEXMA gives them on the CPU, so the host does not wait for the GPU here. ``head``: the module
    whose projection ``logits`` is, for :func:`modsent.training.fastpath.fuse_cross_entropy` (the
    cross-entropy through a Triton kernel where it marked it). ``chunk_rows``: the projection
    and its cross-entropy computed that many positions at a time, no logits kept for the backward
    (:func:`modsent.training.fastpath.projection_cross_entropy`; the backward computes them again);
    ``projection`` then gives the projection's (weight, bias), whose ``F.linear`` is ``logits``."""

    def __init__(self, reduction: str = "mean", chunk_rows: int | None = None):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        from modsent.training.vocab_loss import is_chunk_rows

        if chunk_rows is not None and not is_chunk_rows(chunk_rows):
            raise ValueError(f"chunk_rows must be a positive integer or None, got {chunk_rows!r}")
        self.reduction, self.chunk_rows = reduction, chunk_rows

    def forward(self, logits, states: torch.Tensor, labels: torch.Tensor, head: nn.Module | None = None,
                projection: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
        from modsent.training import fastpath

        selected, targets = masked_positions(states, labels)
        if self.chunk_rows is None:
            return fastpath.mlm_cross_entropy(head, logits(selected), targets, self.reduction)
        if projection is None:
            raise ValueError("CrossUnmaskingLoss with chunk_rows needs the projection's (weight, bias)")
        return fastpath.projection_cross_entropy(head, selected, *projection, targets, self.reduction,
                                                 self.chunk_rows)


class WMDAnchorLoss(nn.Module):
    """DuEAM's semantic loss L_A (the DuEAM paper's Eq. 1): the learner's Euclidean distance
    between a pair's sentence vectors is pulled towards the pair's word mover's distance d_wmd,
    a constant per pair computed from a frozen anchor model's token states:

        L_A = (1/N) sum_i exp(|exp(-d_euc(s'_i, t'_i)) - exp(-d_wmd(s_i, t_i))|)

    with d_euc = ||s'_i - t'_i||_2 between the unnormalised vectors. Each term is at least 1 and
    equals 1 when d_euc = d_wmd: close pairs (small WMD) are pulled together and distant ones
    pushed apart, so the space keeps a spread without negatives. ``wmd`` holds one distance per
    pair and gets no gradient. Computed in float32 (the norm's gradient at d_euc = 0 is 0)."""

    def forward(self, sources: torch.Tensor, targets: torch.Tensor, wmd: torch.Tensor) -> torch.Tensor:
        if len(sources) != len(targets) or len(wmd) != len(sources):
            raise ValueError(f"one target and one WMD per source: {len(sources)} sources, {len(targets)} "
                             f"targets, {len(wmd)} distances")
        d_euc = torch.linalg.vector_norm(sources.float() - targets.float(), dim=-1)
        d_wmd = torch.as_tensor(wmd, dtype=d_euc.dtype, device=d_euc.device).detach()
        return torch.exp((torch.exp(-d_euc) - torch.exp(-d_wmd)).abs()).mean()


class MeanPairCosine(nn.Module):
    """DuEAM's translation-mining term L_B (Eq. 2): the mean cosine similarity of each pair's
    two vectors, (1/N) sum_i cos(s'_i, t'_i). A similarity, to be maximised (DuEAMLoss subtracts
    it): it pulls each pair together and pushes nothing apart, so on its own it lets the whole
    space collapse (every vector towards one direction)."""

    def forward(self, sources: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if len(sources) != len(targets):
            raise ValueError(f"one target per source: {len(sources)} sources, {len(targets)} targets")
        return nn.functional.cosine_similarity(sources.float(), targets.float(), dim=-1).mean()


class DuEAMLoss(nn.Module):
    """DuEAM's multi-task objective, L = L_A - lambda * L_B (:class:`WMDAnchorLoss`,
    :class:`MeanPairCosine`; the paper's lambda: 0.003). ``objective`` picks the paper's
    ablations [Fig. 2]: ``joint`` (L_A - lambda L_B), ``LA`` (L_A alone), ``LB`` (-L_B alone, the
    cosine term with weight 1). No negatives: every term is a function of one pair."""

    OBJECTIVES = ("joint", "LA", "LB")

    def __init__(self, lambda_: float = 0.003, objective: str = "joint"):
        super().__init__()
        if objective not in self.OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(self.OBJECTIVES)}, got {objective!r}")
        if not lambda_ >= 0:
            raise ValueError(f"lambda must be at least 0, got {lambda_}")
        self.lambda_, self.objective = lambda_, objective
        self.anchor_loss, self.cosine = WMDAnchorLoss(), MeanPairCosine()

    def forward(self, sources: torch.Tensor, targets: torch.Tensor, wmd: torch.Tensor) -> torch.Tensor:
        if self.objective == "LB":
            return -self.cosine(sources, targets)
        anchor = self.anchor_loss(sources, targets, wmd)
        if self.objective == "LA":
            return anchor
        return anchor - self.lambda_ * self.cosine(sources, targets)


class InfoNCELoss(nn.Module):
    """InfoNCE with cosine similarity and a temperature (Oord et al. 2018; SimCSE; the InteMATs
    paper's Eq. 2), over (anchor, positive) pairs with in-batch negatives:

        l_i = -log e^{cos(a_i, p_i)/t} / sum_j e^{cos(a_i, p_j)/t}

    Pulls each anchor (InteMATs: the English text) towards its own positive (its aligned text in
    another language) and pushes it away from every other positive of the batch. One direction
    only, as the paper writes it. It is :class:`MultipleNegativesRankingLoss` with ``scale = 1 /
    t`` and no hard negatives (t = 0.1 is scale 10); a class of its own so that the temperature
    is the setting and the formula is tested as the paper states it. Similarities in float32.
    """

    def __init__(self, temperature: float = 0.1):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        if len(positives) != len(anchors):
            raise ValueError(f"one positive per anchor: {len(anchors)} anchors, {len(positives)} positives")
        scores = cos_sim(anchors.float(), positives.float()) / self.temperature
        target = torch.arange(len(anchors), device=anchors.device)
        return nn.functional.cross_entropy(scores, target)

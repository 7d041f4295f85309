"""MEXMA's model: one shared encoder (every weight trained; the sentence vector is the raw CLS
state of the last layer, no pooler, no normalisation) and an unmasking head that restores one
language's masked tokens from the *other* language's clean sentence vector.

    S_A = encoder(A)[:, 0]                     S_B = encoder(B)[:, 0]          (clean passes)
    H_A = encoder(mask(A))                     H_B = encoder(mask(B))          (masked passes)
    head_A = head([S_B, H_A[:, 1:]])           head_B = head([S_A, H_B[:, 1:]])

Position 0 of the masked sequence's states is *replaced* by the other side's clean CLS, so the
only way for the head to see the sentence's content at masked positions is through the other
language's sentence vector. The head: ``head_layers`` transformer layers (XLM-R's layer,
post-LayerNorm, GELU FFN; ``head_heads`` attention heads, attention dropout off as in the
public code) and a vocabulary projection whose weight is the encoder's word embedding matrix
(tied) with a bias of its own (zero at the start). The encoder's attention dropout is switched
off too (:func:`attention_dropout_off`), as in the public code. ``detach_tokens`` (the paper's "no-tok"
ablation) stops the token-level gradient at the head's input: the masked passes then train
nothing of the encoder, only the sentence vector does.

The four passes run as two: clean and masked A share one forward call (the same length and
attention mask), and so do B's; rows are independent, so this is the four passes' result.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

from modsent.io import InputError
from modsent.training.seeding import private_cpu_stream


class UnmaskingHead(nn.Module):
    """``layers`` XLM-R transformer layers of the encoder's width over a sequence of states; its
    vocabulary projection (:meth:`logits`) uses the tied embedding matrix given to it."""

    def __init__(self, body_config, layers: int, heads: int, intermediate_size: int | None,
                 word_embeddings: nn.Embedding, key: str = "methods.MEXMA"):
        super().__init__()
        from transformers import XLMRobertaConfig
        from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaEncoder

        hidden = body_config.hidden_size
        if hidden % heads:
            raise InputError(f"{key}.head_heads: {heads} does not divide the encoder's width {hidden}")
        self.config = XLMRobertaConfig(
            vocab_size=word_embeddings.num_embeddings, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate_size or getattr(body_config, "intermediate_size", 4 * hidden),
            hidden_dropout_prob=getattr(body_config, "hidden_dropout_prob", 0.1),
            attention_probs_dropout_prob=0.0, layer_norm_eps=getattr(body_config, "layer_norm_eps", 1e-12))
        self.config._attn_implementation = "sdpa"
        self.encoder = XLMRobertaEncoder(self.config)
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))
        self._embeddings = [word_embeddings]  # a list: the tied matrix is the encoder's parameter, not the head's

    def forward(self, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        mask = create_bidirectional_mask(config=self.config, inputs_embeds=states, attention_mask=attention_mask)
        return self.encoder(states, attention_mask=mask).last_hidden_state

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Scores over the vocabulary: ``states @ E^T + bias`` with E the word embeddings."""
        return nn.functional.linear(states, *self.projection())

    def projection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of :meth:`logits`: the word embeddings E and the head's bias."""
        return self._embeddings[0].weight, self.bias


class MEXMAModel(nn.Module):
    """The encoder ``body`` (a Hugging Face encoder without pooler) and the unmasking head."""

    def __init__(self, body: nn.Module, head: UnmaskingHead, detach_tokens: bool = False):
        super().__init__()
        self.body, self.head, self.detach_tokens = body, head, detach_tokens

    def sentence_vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The raw last-layer CLS states [batch, hidden]."""
        return self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]

    def _clean_and_masked(self, clean: torch.Tensor, masked: torch.Tensor, mask: torch.Tensor | None):
        n = len(clean)
        both = None if mask is None else torch.cat([mask, mask])
        states = self.body(input_ids=torch.cat([clean, masked]), attention_mask=both).last_hidden_state
        return states[:n, 0], states[n:]

    def forward(self, a_ids: torch.Tensor, a_masked: torch.Tensor, a_mask: torch.Tensor,
                b_ids: torch.Tensor, b_masked: torch.Tensor, b_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The four passes: ``s_a``, ``s_b`` (clean CLS vectors) and ``head_a``, ``head_b`` (the
        head's output states over A's and B's masked sequences, each conditioned on the other
        side's clean vector at position 0). The masks: the 2D padding masks, or what
        :func:`modsent.tokenizing.encoder_attention_mask` makes of them (None: no padding; a 4D
        boolean mask), which transformers takes without looking at the device's copy."""
        s_a, masked_a = self._clean_and_masked(a_ids, a_masked, a_mask)
        s_b, masked_b = self._clean_and_masked(b_ids, b_masked, b_mask)
        if self.detach_tokens:
            masked_a, masked_b = masked_a.detach(), masked_b.detach()
        head_in_a = torch.cat([s_b.unsqueeze(1).to(masked_a.dtype), masked_a[:, 1:]], dim=1)
        head_in_b = torch.cat([s_a.unsqueeze(1).to(masked_b.dtype), masked_b[:, 1:]], dim=1)
        return {"s_a": s_a, "s_b": s_b, "head_a": self.head(head_in_a, a_mask), "head_b": self.head(head_in_b, b_mask)}


def attention_dropout_off(body: nn.Module) -> int:
    """Switch the attention-probability dropout of every self-attention block off (as the public
    code does in the encoder and the head; the hidden-state dropout stays); the count switched."""
    count = 0
    for name, module in body.named_modules():
        dropout = getattr(module, "dropout", None)
        if name.endswith("attention.self") and isinstance(dropout, nn.Dropout):
            dropout.p = 0.0
            count += 1
    return count


def build_model(source: str, *, revision: str | None, head_layers: int, head_heads: int,
                head_intermediate_size: int | None, detach_tokens: bool, seed: int, key: str):
    """(MEXMAModel, tokenizer) from ``source`` (a Hub id or a local directory): the encoder's
    body without its pooler, every weight trainable, and a fresh head drawn from ``seed``."""
    from modsent.encoders import transformer as tf

    with private_cpu_stream(seed):
        body, tokenizer = tf.load_encoder_body(source, revision=revision)
        pooler = getattr(body, "pooler", None)
        if pooler is not None:
            body.pooler = None  # MEXMA's vector is the raw CLS state: the pooler is neither used nor trained
        attention_dropout_off(body)
        tokenizer.padding_side = "right"  # the trainer trims each share's padding on the right
        if tokenizer.mask_token_id is None or tokenizer.cls_token_id is None:
            raise InputError(f"{key}.model: {source} has no mask or CLS token; MEXMA needs an MLM "
                             "encoder with a CLS position (XLM-R, BERT)")
        head = UnmaskingHead(body.config, head_layers, head_heads, head_intermediate_size,
                             body.get_input_embeddings(), key)
    model = MEXMAModel(body, head, detach_tokens)
    model.requires_grad_(True)
    # the source's pooler, untouched, goes back into the saved model (restore_pooler): a plain
    # AutoModel load then finds every weight; CLS pooling does not use it
    model.untrained_pooler = [pooler]
    return model, tokenizer


def _checkpoint(function, *args):
    # looked up at each call (not bound once), so a test can watch it
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


def checkpoint_activations(model: MEXMAModel, on: bool = True, key: str = "methods.MEXMA") -> int:
    """Keep only each transformer layer's input for the backward, which runs the layer again
    (``on=False`` undoes it): the body's layers and the head's, through transformers' own layer
    checkpointing (``GradientCheckpointingLayer``, in training mode only) with PyTorch's
    non-reentrant ``checkpoint``, which restores the random state before the second run so it
    draws the same dropout masks: the same training up to float rounding, with the layers'
    activations (most of MEXMA's memory: 3.3 GiB per 1,000 pair-tokens at the base size) traded
    for one more forward of the body and the head. Returns the layers switched; an encoder whose
    layers transformers cannot checkpoint is an :class:`InputError` naming ``key``."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    def layers(module: nn.Module) -> list[GradientCheckpointingLayer]:
        return [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer)]

    if not layers(model.body):
        raise InputError(f"{key}.gradient_checkpointing: {type(model.body).__name__} has no layers transformers "
                         "can checkpoint (GradientCheckpointingLayer)")
    switched = layers(model)
    for layer in switched:
        layer.gradient_checkpointing = on
        layer._gradient_checkpointing_func = _checkpoint
    return len(switched)


def restore_pooler(model: MEXMAModel) -> None:
    """Put the source's (untrained) pooler back into the body, for saving."""
    pooler = getattr(model, "untrained_pooler", [None])[0]
    if pooler is not None:
        model.body.pooler = pooler.to(next(model.body.parameters()).device)

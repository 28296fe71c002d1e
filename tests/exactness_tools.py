"""Tools for the exact-distribution tests (spec section 7).

A tiny random transformers causal LM with a 3-5 token vocabulary and peaked, prefix-dependent
conditionals; its exact joint distribution over every image-token sequence, computed by a plain
full forward (no cache, no sampler code); and a fast adapter that serves those same exact
conditionals to the sampler from a table, so tens of thousands of samples take seconds.
"""

from __future__ import annotations

import itertools
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from scipy import stats as scipy_stats
from transformers import LlamaConfig, LlamaForCausalLM

import sjd_pac_core as sp
from sjd_pac_core.models.base import DecoderSession, TokenModel
from sjd_pac_core.sampling.recipe import SamplingRecipe, TokenConstraints, process


def tiny_causal_lm(vocab_size: int, seed: int = 1, head_scale: float = 20.0, layers: int = 2) -> LlamaForCausalLM:
    """A random Llama with a tiny vocabulary whose conditionals are peaked and depend strongly on
    the whole prefix (scaled embeddings and head; mean entropy ~0.7 nats at V=3)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
        model.model.embed_tokens.weight.mul_(3.0)
    return model


def seed_exact_lm() -> LlamaForCausalLM:
    """A random Llama (vocabulary 64, fp32) whose entropy is high enough that drafts are often
    rejected: the model of the seed-exact tests."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
    return model


@torch.no_grad()
def conditional_logits(model, prompt: torch.Tensor, vocab: int, num_tokens: int) -> Dict[Tuple[int, ...], torch.Tensor]:
    """{image prefix: logits [V] for the next image token}, for every prefix of up to num_tokens.

    One batched full forward over every sequence of num_tokens image tokens: no KV cache, no
    sampler code involved. (Prefixes of length num_tokens are what a pass that reaches the end
    computes beyond it; the sampler never uses them.)
    """
    seqs = list(itertools.product(range(vocab), repeat=num_tokens))
    batch = torch.tensor([list(prompt.tolist()) + list(s) for s in seqs], dtype=torch.long)
    logits = model(input_ids=batch).logits.float()  # [R, T + N - 1, V]
    t0 = prompt.shape[0] - 1
    table: Dict[Tuple[int, ...], torch.Tensor] = {}
    for r, seq in enumerate(seqs):
        for t in range(num_tokens + 1):
            table.setdefault(tuple(seq[:t]), logits[r, t0 + t])
    return table


def exact_joint(
    tables: Sequence[Dict[Tuple[int, ...], torch.Tensor]],
    vocab: int,
    num_tokens: int,
    config: sp.SamplerConfig,
    constraints: Optional[TokenConstraints] = None,
) -> Dict[Tuple[int, ...], float]:
    """P(x_1..x_N) under plain AR with the sampler's recipe, for every sequence."""
    recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
    constraints = constraints or TokenConstraints(vocab, num_tokens)
    joint = {}
    for seq in itertools.product(range(vocab), repeat=num_tokens):
        prob = 1.0
        for t in range(num_tokens):
            rows = torch.stack([tab[tuple(seq[:t])] for tab in tables]).unsqueeze(1)  # [B, 1, V]
            p = process(rows, torch.tensor([t]), recipe, constraints)[0]
            prob *= float(p[seq[t]])
            if prob == 0.0:
                break
        joint[seq] = prob
    return joint


class TableSession(DecoderSession):
    """Serves the exact conditionals of the real model for the prefix each node sees."""

    def __init__(self, tables):
        self.tables = tables
        self.kept: List[int] = []  # image tokens whose "cache" is kept
        self.nodes: List[List[int]] = []  # prefix each node of the last pass saw

    def prefill(self):
        return torch.stack([tab[()] for tab in self.tables])

    def forward(self, tokens, depths, attend):
        toks = tokens.tolist()
        rows = attend.tolist()
        self.nodes = [self.kept + [toks[j] for j in range(len(toks)) if row[j]] for row in rows]
        out = [[self._lookup(tab, prefix) for prefix in self.nodes] for tab in self.tables]
        return torch.stack([torch.stack(r) for r in out])

    @staticmethod
    def _lookup(table, prefix):
        key = tuple(prefix)
        if key not in table and len(key) > max(map(len, table)):
            # Beyond the image: only window="auto"'s cost probe feeds such chains; the sampler
            # never reads them (a wrong prefix inside the image still raises KeyError).
            return torch.zeros_like(table[()])
        return table[key]

    def keep(self, nodes):
        if nodes:
            self.kept = self.nodes[nodes[-1]]
        self.nodes = []

    def close(self):
        self.kept = []


class TableModel(TokenModel):
    def __init__(self, tables_by_prompt: Dict[Tuple[int, ...], dict], vocab: int):
        self.tables_by_prompt = tables_by_prompt
        self.vocab_size = vocab

    @property
    def device(self):
        return torch.device("cpu")

    def open_session(self, prompts):
        return TableSession([self.tables_by_prompt[tuple(p.tolist())] for p in prompts])


def draw_samples(model, prompt, num_tokens, config, samples, uncond=None, allowed=None, seed0=0):
    counts: Dict[Tuple[int, ...], int] = {}
    for s in range(samples):
        out = sp.sample_tokens(model, prompt, num_tokens, config=config, seed=seed0 + s,
                               uncond_prompt_ids=uncond, allowed_tokens=allowed)
        key = tuple(out.tokens.tolist())
        counts[key] = counts.get(key, 0) + 1
    return counts


def compare(counts: Dict[Tuple[int, ...], int], joint: Dict[Tuple[int, ...], float]):
    """(chi-square p-value, total variation, expected TV of an exact sampler at this n)."""
    n = sum(counts.values())
    assert set(counts) <= {k for k, v in joint.items() if v > 0}, "sampled an impossible sequence"
    keys = sorted(joint, key=lambda k: -joint[k])
    obs, exp = [], []
    pool_o, pool_e = 0.0, 0.0
    for k in keys:  # pool the rare sequences so every bin expects >= 5
        e = joint[k] * n
        if e >= 5:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            pool_o += counts.get(k, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp_total = sum(exp)
    exp = [e * n / exp_total for e in exp]
    p_value = float(scipy_stats.chisquare(obs, exp).pvalue)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - joint[k]) for k in joint)
    noise = 0.5 * sum(math.sqrt(2 * p * (1 - p) / (math.pi * n)) for p in joint.values())
    return p_value, tv, noise

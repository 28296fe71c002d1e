"""Tools for the exact-distribution tests (spec section 7).

A tiny random transformers causal LM with a 3-5 token vocabulary and peaked, prefix-dependent
conditionals; its exact joint distribution over every image-token sequence, computed by a plain
full forward (no cache, no sampler code); and a fast adapter that serves those same exact
conditionals to the sampler from a table, so tens of thousands of samples take seconds (the
setting the exactness files share: tiny_joint, joint_check, the thresholds). Chain models (first
and second order) with exact pair laws; the chi-square tests and their power (how many samples a
planted fault needs: planted_power.py); and the planted faults (FAULTS).
"""

from __future__ import annotations

import __future__
import contextlib
import dataclasses
import functools
import importlib
import inspect
import itertools
import math
import sys
import textwrap
from dataclasses import dataclass
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats
from transformers import LlamaConfig, LlamaForCausalLM

import sjd_pac_core as sp
from sjd_pac_core.models.base import DecoderSession, TokenModel
from sjd_pac_core.sampling.recipe import SamplingRecipe, TokenConstraints, process


def tiny_causal_lm(vocab_size: int, seed: int = 1, head_scale: float = 20.0, layers: int = 2,
                   attention_scale: float = 1.0) -> LlamaForCausalLM:
    """A random Llama with a tiny vocabulary whose conditionals are peaked and depend on the
    prefix (scaled embeddings and head; mean entropy ~0.7 nats at V=3). With attention_scale > 1
    its attention is peaked (query and key weights x attention_scale) and weighs more against
    the token's own embedding (value and output weights x sqrt(attention_scale)), so which keys
    a node sees (cache entries, masks, positions) moves its logits by more than a percent."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
        model.model.embed_tokens.weight.mul_(3.0)
        for layer in model.model.layers:
            attention = layer.self_attn
            for proj, scale in ((attention.q_proj, attention_scale), (attention.k_proj, attention_scale),
                                (attention.v_proj, attention_scale ** 0.5), (attention.o_proj, attention_scale ** 0.5)):
                proj.weight.mul_(scale)
    return model


# Scale of the seed-exact model's query and key weights. At 1 (the random init) attention is
# nearly uniform and RoPE barely moves a logit: a position id off by one in the unconditional row
# or past depth 8 changed no token of the seed-exact runs. At 8 attention is peaked, so it
# changes tokens in every CFG run (unconditional row) and in most runs with windows of 16 and more
# (past depth 8); test_seed_exact's planted controls hold it to that.
SEED_EXACT_QK_SCALE = 8.0


def seed_exact_lm() -> LlamaForCausalLM:
    """A random Llama (vocabulary 64, fp32) whose entropy is high enough that drafts are often
    rejected and whose attention is peaked enough that positions matter: the model of the
    seed-exact tests."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(SEED_EXACT_QK_SCALE)
            layer.self_attn.k_proj.weight.mul_(SEED_EXACT_QK_SCALE)
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


def gumbel_cfg_tokens(model, method: str, seed: int, prompt: str = "a red cat on the blue field",
                      **kw) -> torch.Tensor:
    """One image's tokens from a loaded family model under the gumbel rule with guidance (scale 3,
    top-k 20, temperature 2: peaked enough to accept runs, loose enough to differ): what tests
    compare loading paths (quantized, offloaded, split embeddings) and methods with."""
    enc = model.encode_prompt(prompt)
    config = model.defaults.sampler_config(method=method, verify="gumbel", cfg_scale=3.0, top_k=20,
                                           temperature=2.0, **kw)
    return sp.sample_tokens(model, enc.prompt_ids, enc.layout.num_tokens, config=config, seed=seed,
                            uncond_prompt_ids=enc.uncond_ids, allowed_tokens=enc.constraints).tokens


def assert_processed_p_matches(model, prompt: str, resolution: str, path: Sequence[int], cfg_scale: float,
                               reference: Sequence[Tuple[int, Sequence[int], Sequence[float]]]) -> None:
    """The processed p (guidance `cfg_scale`, temperature 1, top-k 20) a Lumina family model gives
    along the image tokens `path`, from plain full forwards of the conditional and unconditional
    prompt (no cache, no sampler code), equals `reference` within 1e-5: rows (position t, the
    model's token ids, their probabilities), a token outside the model's image codes at 0."""
    enc = model.encode_prompt(prompt, resolution=resolution)
    space = model.token_model.token_space
    path = torch.tensor(path)
    hf = model.model
    rows = []
    with torch.no_grad():
        for ids in (enc.prompt_ids, enc.uncond_ids):
            full = torch.cat([ids, path[:-1]])[None]
            hidden = hf.model(input_ids=full).last_hidden_state[0, ids.shape[0] - 1 :]
            rows.append(hf.lm_head(hidden)[:, space])
    p = process(torch.stack(rows), torch.arange(path.shape[0]), SamplingRecipe(cfg_scale, 1.0, 20, None),
                enc.constraints)
    sampler_id = {int(token): i for i, token in enumerate(space.tolist())}
    for t, ids, ref_p in reference:
        ours = [float(p[t, sampler_id[i]]) if i in sampler_id else 0.0 for i in ids]
        assert np.allclose(ours, ref_p, atol=1e-5), (t, ids, ours, ref_p)


def RejectionConfig(**fields) -> sp.SamplerConfig:
    """A SamplerConfig under the rejection rule. The statistical tests of the rejection rule (its
    planted faults live in the residual and the tree's recursion, and their sample sizes were set
    for it) pin it, since the default rule is gumbel."""
    return sp.SamplerConfig(**{"verify": "rejection", **fields})


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


# --- the tiny Llama's exact joint, shared by test_exactness, test_drafters, test_budget_drafting -----
V, N = 3, 5  # vocabulary, image tokens: 243 sequences, each with its exact probability
PROMPT = torch.tensor([0, 1])
UNCOND = torch.tensor([2])  # the unconditional prompt guidance (cfg_scale) reads
P_VALUE_MIN = 1e-3
P_VALUE_PLANTED_MAX = 1e-6  # every planted control must fail at least this clearly
TV_FACTOR = 1.5


class TinyJoint(NamedTuple):
    """The tiny Llama over V, its exact conditionals after PROMPT and UNCOND, and the table model
    that serves them to the sampler."""

    model: LlamaForCausalLM
    cond: Dict[Tuple[int, ...], torch.Tensor]
    uncond: Dict[Tuple[int, ...], torch.Tensor]
    table: TableModel


def tiny_joint() -> TinyJoint:
    model = tiny_causal_lm(V)
    cond = conditional_logits(model, PROMPT, V, N)
    uncond = conditional_logits(model, UNCOND, V, N)
    table = TableModel({tuple(PROMPT.tolist()): cond, tuple(UNCOND.tolist()): uncond}, V)
    return TinyJoint(model, cond, uncond, table)


def joint_check(tiny: TinyJoint, config: sp.SamplerConfig, samples: int, seed0: int = 0,
                constraints: Optional[TokenConstraints] = None) -> Tuple[float, float, float]:
    """`samples` images of N tokens drawn from the table under `config` (seeds seed0, seed0 + 1, ...),
    against the exact joint: (chi-square p-value, total variation, its noise level)."""
    joint = exact_joint([tiny.cond] + ([tiny.uncond] if config.uses_cfg else []), V, N, config, constraints)
    counts = draw_samples(tiny.table, PROMPT, N, config, samples, uncond=UNCOND, allowed=constraints, seed0=seed0)
    return compare(counts, joint)


# --- a Markov-chain table model: exact marginals in closed form, vectorised conditionals ------

class MarkovChain:
    """Image tokens as a (position-dependent) Markov chain: logits for x_0, then for x_t given x_{t-1}.

    Conditionals that depend on the previous token make the stale proposals of Proactive
    Drafting wrong in a structured way: after a redraw at position i, the candidates for i+1 were
    drawn from q = P(. | old x_i) while the target is P(. | new x_i), so the first candidate is
    often rejected and a sibling accepted. Exact per-position and pairwise marginals follow from
    products of the (processed) transition matrices, so no enumeration is needed.
    """

    def __init__(self, first: torch.Tensor, transitions: torch.Tensor) -> None:
        self.first = first  # [V] logits for x_0
        self.transitions = transitions  # [N, V, V]: row a of transitions[t] = logits for x_t given x_{t-1} = a
        self.vocab_size = int(first.shape[0])
        self.num_tokens = int(transitions.shape[0])

    @classmethod
    def shifted(cls, vocab: int, num_tokens: int, profile: Sequence[float], noise: float = 0.3,
                seed: int = 0) -> "MarkovChain":
        """x_t given x_{t-1} = a puts logit profile[j] on token (a + 1 + j) mod V, plus a little
        position-dependent noise: neighbouring contexts prefer neighbouring tokens, so a changed
        context moves the mode onto the old proposal's second or third choice."""
        gen = torch.Generator().manual_seed(seed)
        base = torch.full((vocab,), -4.0)
        base[: len(profile)] = torch.tensor(profile, dtype=torch.float32)
        rows = torch.stack([base.roll(a + 1) for a in range(vocab)])  # [V, V]
        trans = rows.unsqueeze(0) + noise * torch.randn(num_tokens, vocab, vocab, generator=gen)
        first = noise * torch.randn(vocab, generator=gen)
        return cls(first, trans)

    def processed(self, config: sp.SamplerConfig, uncond: Optional["MarkovChain"] = None,
                  constraints: Optional[TokenConstraints] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(p_0 [V], P [N, V, V]) after the sampler's recipe; P[t, a] = p(x_t | x_{t-1} = a)."""
        recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
        v, n = self.vocab_size, self.num_tokens
        constraints = constraints or TokenConstraints(v, n)
        chains = [self] + ([uncond] if config.uses_cfg else [])
        first = torch.stack([c.first for c in chains]).unsqueeze(1)  # [B, 1, V]
        p0 = process(first, torch.tensor([0]), recipe, constraints)[0].double()
        trans = torch.zeros(n, v, v, dtype=torch.float64)
        for t in range(1, n):  # N - 1 small batched calls of the product's own recipe
            rows = torch.stack([c.transitions[t] for c in chains])  # [B, V, V]
            trans[t] = process(rows, torch.full((v,), t), recipe, constraints).double()
        return p0, trans

    def pair_laws(self, config: sp.SamplerConfig) -> List["PairLaw"]:
        """The exact laws the tests compare with: every adjacent pair (x_t, x_t+1)."""
        return markov_pair_laws(*self.processed(config))

    def model(self) -> "MarkovModel":
        return MarkovModel({(0,): self})


class MarkovSession(DecoderSession):
    """Serves a MarkovChain's logits: a node's conditional needs only its depth in the sequence
    and its own token (the previous image token); beyond the image, zeros (only the auto window's
    cost probe goes there)."""

    def __init__(self, chains: Sequence[MarkovChain]) -> None:
        n, v = chains[0].num_tokens, chains[0].vocab_size
        self.first = torch.stack([c.first for c in chains])  # [B, V]
        # transitions padded with zeros for positions beyond the image
        self.trans = torch.zeros(len(chains), n + 1, v, v)
        self.trans[:, :n] = torch.stack([c.transitions for c in chains])
        self.n = n
        self.kept = 0  # image tokens whose "cache" is kept
        self.positions: Optional[torch.Tensor] = None  # image position each node of the last pass predicts

    def prefill(self) -> torch.Tensor:
        return self.first.clone()

    def forward(self, tokens, depths, attend):
        # node i holds image token kept + (ancestors incl. itself) - 1 and predicts the next one
        self.positions = self.kept + attend.sum(-1)
        pos = self.positions.clamp(max=self.n)
        return self.trans[:, pos, tokens]  # [B, S, V]

    def keep(self, nodes):
        self.kept += len(nodes) if nodes else 0
        self.positions = None

    def close(self):
        self.kept = 0


class MarkovModel(TokenModel):
    """A TokenModel over Markov chains: one per prompt, looked up by the prompt's ids."""

    def __init__(self, chains_by_prompt: Dict[Tuple[int, ...], MarkovChain]) -> None:
        self.chains_by_prompt = chains_by_prompt
        self.vocab_size = next(iter(chains_by_prompt.values())).vocab_size

    @property
    def device(self):
        return torch.device("cpu")

    def open_session(self, prompts):
        return MarkovSession([self.chains_by_prompt[tuple(p.tolist())] for p in prompts])


class SecondOrderChain:
    """Image tokens whose law depends on the previous two: the logits for x_t given
    (x_t-2, x_t-1) are parent * profile rolled to x_t-1 + 1 plus grand * profile rolled to
    x_t-2 + 1 (plus position noise); x_-1 is a start symbol V. A node's p then depends on its
    grandparent's token, which a first-order chain cannot show: the test model for side chains,
    whose drafts follow a side leaf, so the same draft has one grandparent on the main chain
    and another on the side chain."""

    def __init__(self, vocab: int, num_tokens: int, profile: Sequence[float], noise: float = 0.3,
                 seed: int = 0, parent: float = 0.5, grand: float = 1.0) -> None:
        gen = torch.Generator().manual_seed(seed)
        base = torch.full((vocab,), -4.0)
        base[: len(profile)] = torch.tensor(profile, dtype=torch.float32)
        rolled = torch.stack([base.roll(k + 1) for k in range(vocab + 1)])  # [V + 1, V]: mode at k + 1
        # logits[t, a2, a1]: a2 in 0..V (V = the start symbol), a1 in 0..V-1
        rows = parent * rolled[:vocab].unsqueeze(0) + grand * rolled.unsqueeze(1)
        self.logits = rows.unsqueeze(0) + noise * torch.randn(num_tokens, vocab + 1, vocab, vocab, generator=gen)
        self.first = noise * torch.randn(vocab, generator=gen)
        self.vocab_size, self.num_tokens = vocab, num_tokens

    def joint(self, config: sp.SamplerConfig) -> torch.Tensor:
        """The exact joint P(x_0 .. x_N-1) after the sampler's recipe, as a tensor [V] * N."""
        recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
        v, n = self.vocab_size, self.num_tokens
        constraints = TokenConstraints(v, n)

        def proc(logits, t):
            return process(logits.unsqueeze(0), torch.full((logits.shape[0],), t), recipe, constraints).double()

        joint = proc(self.first.unsqueeze(0), 0)[0]
        if n > 1:
            joint = joint.unsqueeze(-1) * proc(self.logits[1, v], 1)
        for t in range(2, n):  # N - 2 steps: multiply in p(x_t | x_t-2, x_t-1)
            cond = proc(self.logits[t, :v].reshape(v * v, v), t).view(v, v, v)
            joint = joint.unsqueeze(-1) * cond.view((1,) * (t - 2) + (v, v, v))
        return joint

    def pair_laws(self, config: sp.SamplerConfig) -> List["PairLaw"]:
        """The exact laws the tests compare with: every pair of positions (x_s, x_t)."""
        return all_pair_laws(self.joint(config))

    def model(self) -> "SecondOrderModel":
        return SecondOrderModel(self)


class SecondOrderSession(DecoderSession):
    """Serves a SecondOrderChain: a node's logits need its own token and its parent's (the
    last kept token for the root); the cache holds the kept tokens themselves."""

    def __init__(self, chain: SecondOrderChain) -> None:
        self.chain = chain
        self.kept: List[int] = []
        self.nodes: List[List[int]] = []

    def prefill(self) -> torch.Tensor:
        return self.chain.first.unsqueeze(0).clone()

    def forward(self, tokens, depths, attend):
        toks, rows = tokens.tolist(), attend.tolist()
        v, n = self.chain.vocab_size, self.chain.num_tokens
        self.nodes = [[toks[j] for j in range(len(toks)) if row[j]] for row in rows]  # parents precede children
        out = []
        for path in self.nodes:
            seq = self.kept + path
            t = len(seq)
            if t >= n:  # beyond the image (the auto window's probe): never read
                out.append(torch.zeros(v))
                continue
            a2 = seq[-2] if len(seq) >= 2 else v
            out.append(self.chain.logits[t, a2, seq[-1]])
        return torch.stack(out).unsqueeze(0)

    def keep(self, nodes):
        if nodes:
            self.kept = self.kept + self.nodes[nodes[-1]]
        self.nodes = []

    def close(self):
        self.kept = []


class SecondOrderModel(TokenModel):
    def __init__(self, chain: SecondOrderChain) -> None:
        self.chain = chain
        self.vocab_size = chain.vocab_size

    @property
    def device(self):
        return torch.device("cpu")

    def open_session(self, prompts):
        return SecondOrderSession(self.chain)


@dataclass(frozen=True)
class PairLaw:
    """The exact joint law of the token columns s and t: [V * V], entry a * V + b = P(x_s = a, x_t = b)."""

    s: int
    t: int
    exact: torch.Tensor

    @property
    def name(self) -> str:
        return f"pair ({self.s}, {self.t})"

    def counts(self, tokens: torch.Tensor) -> torch.Tensor:
        """The sampled table of columns s and t, as counts [V * V]."""
        v = int(math.isqrt(self.exact.numel()))
        return torch.bincount(tokens[:, self.s] * v + tokens[:, self.t], minlength=v * v).double()


def markov_pair_laws(p0: torch.Tensor, trans: torch.Tensor) -> List[PairLaw]:
    """Every adjacent pair (x_t, x_t+1) of a Markov chain: they determine every per-position
    marginal and every conditional, which is where a wrong sibling law or residual shows."""
    laws, marginal = [], p0
    for t in range(trans.shape[0] - 1):
        laws.append(PairLaw(t, t + 1, (marginal.unsqueeze(-1) * trans[t + 1]).reshape(-1)))
        marginal = marginal @ trans[t + 1]
    return laws


def all_pair_laws(joint: torch.Tensor) -> List[PairLaw]:
    """Every pair of positions (x_s, x_t), s < t, of an exact joint [V] * N. Pairs at a distance
    show what adjacent pairs miss in a second-order chain (a token committed against its
    grandparent's wrong p)."""
    n = joint.dim()
    return [PairLaw(s, t, joint.sum(dim=[d for d in range(n) if d not in (s, t)]).reshape(-1))
            for s, t in itertools.combinations(range(n), 2)]


def _pooled(observed: torch.Tensor, expected: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The bins a chi-square test compares: those expecting >= 5, and the rest pooled into one."""
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    return obs[keep], exp[keep]


def pair_laws_pvalue(tokens: torch.Tensor, laws: Sequence[PairLaw]) -> Tuple[float, str]:
    """Bonferroni-combined chi-square p-value of every pair's sampled table against its exact
    law, and the name of the worst pair. Cells expecting < 5 are pooled; an impossible pair
    fails at once."""
    worst, worst_name = 1.0, ""
    for law in laws:
        observed = law.counts(tokens)
        assert bool((observed[law.exact == 0] == 0).all()), f"{law.name}: sampled an impossible pair"
        obs, exp = _pooled(observed, law.exact * tokens.shape[0])
        p_value = float(scipy_stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)
        if p_value < worst:
            worst, worst_name = p_value, law.name
    return min(1.0, worst * len(laws)), worst_name


def all_pairs_pvalue(tokens: torch.Tensor, joint: torch.Tensor) -> Tuple[float, str]:
    """pair_laws_pvalue over every pair of positions of the exact joint [V] * N."""
    return pair_laws_pvalue(tokens, all_pair_laws(joint))


def draw_sequences(model, prompt, num_tokens, config, samples, uncond=None, allowed=None, seed0=0,
                   passes: Optional[List] = None) -> torch.Tensor:
    """samples x num_tokens sampled tokens (long); the runs' pass records go to `passes`."""
    out = torch.empty(samples, num_tokens, dtype=torch.long)
    for s in range(samples):
        result = sp.sample_tokens(model, prompt, num_tokens, config=config, seed=seed0 + s,
                                  uncond_prompt_ids=uncond, allowed_tokens=allowed)
        out[s] = result.tokens
        if passes is not None:
            passes.extend(result.stats.records[1:])
    return out


# --- power: how many samples a planted fault needs -------------------------------------------

def chi_square_power(faulty: torch.Tensor, exact: torch.Tensor, n: int, alpha: float,
                     pilot: int = 0) -> Tuple[float, float]:
    """(power, median p-value) of a chi-square test of n samples drawn from the law `faulty`
    against `exact` (both [bins]; bins expecting < 5 pooled as the tests pool them): the
    probability that it gives p < alpha, and its median p, from the noncentral chi-square with
    lambda = n * sum (f - e)^2 / e. A `faulty` law estimated from a pilot run of `pilot` samples
    carries that run's noise, whose mean, sum f (1 - f) / (pilot e), is taken off lambda."""
    faulty, exact = faulty.double(), exact.double()
    fault_bins, exact_bins = _pooled(faulty, exact * n)
    exact_bins = exact_bins / n
    effect = ((fault_bins - exact_bins) ** 2 / exact_bins).sum().item()
    if pilot:
        effect -= (fault_bins * (1 - fault_bins) / exact_bins).sum().item() / pilot
    df = int(exact_bins.numel()) - 1
    lam = max(effect, 0.0) * n
    if df < 1 or lam <= 0:
        return alpha, 0.5
    critical = scipy_stats.chi2.isf(alpha, df)
    power = float(scipy_stats.ncx2.sf(critical, df, lam))
    if not math.isfinite(power):  # scipy gives up far in the tail: lambda dwarfs the critical value
        power = 1.0 if lam > critical else 0.0
    middle = float(scipy_stats.ncx2.median(df, lam))
    median = float(scipy_stats.chi2.sf(middle if math.isfinite(middle) else df + lam, df))
    return power, median


def pair_laws_power(pilot_tokens: torch.Tensor, laws: Sequence[PairLaw], n: int,
                    alpha: float = 1e-6) -> Tuple[float, float, str]:
    """(power, median Bonferroni p, pair) of `pair_laws_pvalue` at n samples of the law a pilot
    run `pilot_tokens` (of a planted fault) estimates: the best single pair's power at
    alpha / pairs, a lower bound on the power of the Bonferroni minimum."""
    best = (0.0, 1.0, "")
    m = pilot_tokens.shape[0]
    for law in laws:
        faulty = law.counts(pilot_tokens) / m
        power, median = chi_square_power(faulty, law.exact, n, alpha / len(laws), pilot=m)
        if (power, -median) > (best[0], -best[1]):
            best = (power, min(1.0, median * len(laws)), law.name)
    return best


def samples_for_power(power_at, target: float = 0.999, start: int = 100, limit: int = 100000) -> int:
    """The smallest n (on a ~1.25x grid from `start`, multiples of 50) with power_at(n)[0] >= target."""
    n = start
    while n < limit and power_at(n)[0] < target:
        n = int(math.ceil(n * 1.25 / 50) * 50)
    return n


def side_branch_share(records) -> float:
    """Share of the passes that carried a PD tree in which a side branch (candidate > 0) won."""
    tree_passes = [r for r in records if r.tree_nodes > 0]
    if not tree_passes:
        return 0.0
    return sum(any(b > 0 for b in r.branch) for r in tree_passes) / len(tree_passes)


# --- planted faults: known sampler bugs, switched on in tests only ----------------------------
#
# Each fault replaces ONE function (a "seam") of the product for the duration of a `with` block.
# The seam is named once, here, by module and attribute; a module-level function is replaced in
# its module and in every loaded sjd_pac_core module that imported it by name (so callers that
# did `from ..sampling.tree import tree_position_ids` see the fault too). The context yields a
# call counter: a fault whose seam never ran proves nothing, and the tests assert it ran.

def _tempered_siblings(original):
    def faulty(self, q, first, k, positions):  # draws from softmax(0.3 log q), the sampler still believes q
        return original(self, torch.softmax(0.3 * torch.log(q), dim=-1), first, k, positions)
    return faulty


def _top_k_siblings(original):
    def faulty(self, q, first, k, positions):  # the K-1 most likely tokens of q after the first, deterministically
        cands, valid = original(self, q, first, k, positions)
        if k <= 1:
            return cands, valid
        logq = torch.log(q).clone()
        logq.scatter_(-1, first.unsqueeze(-1), float("-inf"))
        return torch.cat([first.unsqueeze(-1), torch.topk(logq, k - 1, dim=-1).indices], -1), valid
    return faulty


def _positions_ignore_padding(original):
    def faulty(depths, root_positions):  # every row counts positions as the unpadded (longest) row does
        return original(depths, root_positions.max().expand_as(root_positions))
    return faulty


def _padding_unmasked(original):
    def faulty(attend, key_valid, dtype):  # left-padding columns of the cache stay visible
        return original(attend, torch.ones_like(key_valid), dtype)
    return faulty


def _always_window_1(original):
    def faulty(self):
        return 1
    return faulty


def _side_chain_main_context(original):
    def faulty(shape):
        # Option (b)'s trap: after a side leaf wins, its chain drafts are verified against the p
        # of the main chain's context, not of a chain fed behind the side leaf: every side-chain
        # node attends to the main branch's nodes of the depths above it instead of its own
        # ancestors (its token is the main chain's draft there, so its p is the main chain's).
        layout = original(shape)
        depths, slots = layout.node_depths, layout.node_slots
        branching = max((d for d, slot in zip(depths, slots) if slot > 0), default=0)
        main = layout.main_nodes
        side = [u for u in range(layout.num_nodes) if depths[u] > branching and u not in main]
        if not side:
            return layout
        attend = layout.attend.clone()
        for u in side:
            attend[u] = layout.attend[main[depths[u]]]
            attend[u, main[depths[u]]] = False
            attend[u, u] = True
        return dataclasses.replace(layout, attend=attend)
    return faulty


def _branch_behind_side_main_context(original):
    def faulty(parents, slots, shape=None):
        # A branch behind a side candidate (any depth, as a budget tree grows them) verified as
        # if the main chain's draft stood where the side candidate does: every node below a side
        # node attends to the main branch's node of that depth instead of the side node.
        layout = original(parents, slots, shape)
        main, depths, slots = layout.main_nodes, layout.node_depths, layout.node_slots
        attend = layout.attend.clone()
        changed = False
        for u in range(1, layout.num_nodes):
            for a in layout.ancestors_path(u)[:-1]:
                if slots[a] > 0 and depths[a] < len(main):
                    attend[u, a], attend[u, main[depths[a]]] = False, True
                    changed = True
        return dataclasses.replace(layout, attend=attend) if changed else layout
    return faulty


def _uniform_chain_siblings(original):
    def faulty(self, q, first, k, positions):
        # Chain siblings drawn uniformly but verified as a draw from q without replacement.
        from sjd_pac_core.sampling.verify import candidate_validity

        cands, _ = original(self, torch.ones_like(q), first, k, positions)
        return cands, candidate_validity(q, k)
    return faulty


def _all_slots_valid(original):
    def faulty(q, width):  # every slot counts as a real candidate, also past q's support
        return torch.ones(q.shape[:-1] + (width,), dtype=torch.bool, device=q.device)
    return faulty


def _uncond_row_deep_positions(original):
    def faulty(depths, root_positions):  # the unconditional (CFG) row's nodes at depth >= 2 one position on
        positions = original(depths, root_positions)
        if positions.shape[0] < 2:
            return positions
        shift = (depths.to(positions.device) >= 2).long().unsqueeze(0)
        return torch.cat([positions[:1], positions[1:] + shift])
    return faulty


def _deep_positions(original):
    def faulty(depths, root_positions):  # nodes deeper than 8 one position on, in every row
        return original(depths, root_positions) + (depths.to(root_positions.device) > 8).long().unsqueeze(0)
    return faulty


class _NarrowCandidates:
    """A rule whose candidate rows are drawn `width` wide; a wider first level is topped up by a
    second draw that excludes only the row's draft, so its extra slots may repeat slots 1..K-1."""

    def __init__(self, rule, width: int) -> None:
        self.rule, self.width = rule, width

    def candidates(self, q, first, k, positions):
        from sjd_pac_core.sampling.verify import candidate_validity

        if k <= self.width:
            return self.rule.candidates(q, first, k, positions)
        cands, _ = self.rule.candidates(q, first, self.width, positions)
        extra, _ = self.rule.candidates(q, first, k - self.width + 1, positions)
        return torch.cat([cands, extra[:, 1:]], -1), candidate_validity(q, k)

    def __getattr__(self, name):
        return getattr(self.rule, name)


def _first_level_drawn_k_wide(original):
    def faulty(ctx, window, start, widths, *args, **kwargs):
        # The tree's candidates are drawn K (the last level's width) wide; the first level's
        # slots past K come from a second draw (see _NarrowCandidates).
        narrow = dataclasses.replace(ctx, rule=_NarrowCandidates(ctx.rule, min(widths[-1:] or (1,))))
        return original(narrow, window, start, widths, *args, **kwargs)
    return faulty


def _chain_sibling_repeats_draft(original):
    def faulty(self, q, first, k, positions):
        # The siblings are a draw without replacement from q itself, not from q without the
        # draft: a sibling may repeat the draft (verified as if it could not).
        cands, valid = original(self, q, first, k, positions)
        if k <= 1:
            return cands, valid
        u = torch.rand(q.shape, generator=self.generator, device=q.device, dtype=torch.float64)
        keys = torch.log(q).double() - torch.log(-torch.log(u.clamp(min=1e-300)))
        return torch.cat([first.unsqueeze(-1), torch.topk(keys, k - 1, dim=-1).indices], -1), valid
    return faulty


def _q_keeps_rejected_mass(original):
    def faulty(p, q, candidates, valid, beside=None):
        # Recursive rejection whose q is never updated: a rejected candidate keeps its mass.
        probs = []
        for k in range(candidates.shape[-1]):
            law = q if k == 0 or beside is None else beside
            prob, p = original(p, law, candidates[:, k : k + 1], valid[:, k : k + 1])
            probs.append(prob)
        return torch.cat(probs, -1), p
    return faulty


def _beside_draft_not_left_out(original):
    def faulty(self, law, first, k, positions):
        # The others a draw without replacement from the whole law: one may repeat the draft,
        # while verification takes them for a draw from the law with the draft left out.
        from sjd_pac_core.sampling.verify import beside_validity

        if k <= 1:
            return original(self, law, first, k, positions)
        u = torch.rand(law.shape, generator=self.generator, device=law.device, dtype=torch.float64)
        keys = torch.log(law).double() - torch.log(-torch.log(u.clamp(min=1e-300)))
        others = torch.topk(keys, k - 1, dim=-1).indices
        return torch.cat([first.unsqueeze(-1), others], -1), beside_validity(law, first, k)
    return faulty


def _beside_with_replacement(original):
    def faulty(self, law, first, k, positions):
        # The others drawn one by one from the law without the draft, each with replacement.
        from sjd_pac_core.sampling.verify import beside_validity

        if k <= 1:
            return original(self, law, first, k, positions)
        rest = law.scatter(-1, first.unsqueeze(-1), 0.0)
        others = torch.multinomial(rest.reshape(-1, rest.shape[-1]), k - 1, replacement=True, generator=self.generator)
        return torch.cat([first.unsqueeze(-1), others.view(*law.shape[:-1], k - 1)], -1), beside_validity(law, first, k)
    return faulty


def _unseen_rows_verified_against_law(original):
    def faulty(ctx, laws, window, start, rows, width):
        # Every row's candidates verified against the law, also a row whose neighbours the law has
        # never seen (its candidates were drawn from its own q).
        out_cands, out_valid, beside = original(ctx, laws, window, start, rows, width)
        if beside is None:
            return out_cands, out_valid, beside
        positions = ctx.positions[start : start + rows]
        law, _ = laws.window_law(start, window.tokens, ctx.committed, ctx.constraints.mask(positions))
        return out_cands, out_valid, law.to(beside.dtype)
    return faulty


def _own_row_first_from_next_token(original):
    def faulty(self, position):
        # An own row's first draft taken from the token the last pass would commit after the
        # node (a residual draw where a child was accepted) instead of its verdict's draw there.
        past = original(self, position)
        if past is None:
            return past
        return dataclasses.replace(past, draft_token=self.last.verdict.next_token)
    return faulty


def _law_unnormalised(original):
    def faulty(self, start, drafts, committed, allowed):
        # The law's weights left unnormalised (its largest entry 1), as the product of experts
        # computes them before the division.
        q, seen = original(self, start, drafts, committed, allowed)
        return q / q.max(-1, keepdim=True).values.clamp(min=1e-30), seen
    return faulty


def _mixture_unnormalised(original):
    def faulty(p_behind, mass):
        # The rejected candidates' p's summed by their mass, not divided by the total mass.
        mixture = original(p_behind, mass)
        total = mass.sum()
        return torch.where(total > 0, mixture * total, mixture)
    return faulty


def _side_candidates_other_noise(original):
    def faulty(log_weights, noise, k):
        # The draft (the top token under the position's noise) kept first, the others ranked by
        # another seed's noise (the position's noise rolled along the vocabulary): still exact
        # under the Gumbel rule, but the candidates are no longer the tokens its target favours.
        from sjd_pac_core.sampling.drafting import draft_and_ranked

        first = original(log_weights, noise, 1)[..., 0]
        ranked = original(log_weights, noise.roll(1, dims=-1), min(k + 1, log_weights.shape[-1]))
        return draft_and_ranked(first, ranked, torch.ones_like(ranked, dtype=torch.bool), k)[0]
    return faulty


FAULTS = {
    # name: (module, attribute ("Class.method" for a method), wrapper(original) -> faulty)
    # Each fault has its own seam: the one function the bug lives in, called by the path it breaks
    # and by no other, so that a change elsewhere can neither hide the fault nor weaken its control.
    "pd_tempered_siblings": ("sjd_pac_core.sampling.rules", "RejectionRule.candidates", _tempered_siblings),
    "pd_topk_siblings": ("sjd_pac_core.sampling.rules", "RejectionRule.candidates", _top_k_siblings),
    "cfg_positions_ignore_padding": ("sjd_pac_core.sampling.tree", "tree_position_ids", _positions_ignore_padding),
    "padding_columns_unmasked": ("sjd_pac_core.sampling.tree", "tree_attention_mask", _padding_unmasked),
    "auto_window_always_1": ("sjd_pac_core.engine.window", "AutoWindow.next_window", _always_window_1),
    "side_chain_main_context": ("sjd_pac_core.sampling.tree", "tree_layout", _side_chain_main_context),
    # every tree is laid out here: a budget's every pass (ranked from its node arrays, greedy from its paths)
    "branch_behind_side_main_context": ("sjd_pac_core.sampling.tree", "layout_of_nodes",
                                        _branch_behind_side_main_context),
    "chain_siblings_uniform": ("sjd_pac_core.sampling.rules", "RejectionRule.chain_candidates", _uniform_chain_siblings),
    "all_slots_valid": ("sjd_pac_core.sampling.verify", "candidate_validity", _all_slots_valid),
    "uncond_row_deep_positions": ("sjd_pac_core.sampling.tree", "tree_position_ids", _uncond_row_deep_positions),
    "deep_positions": ("sjd_pac_core.sampling.tree", "tree_position_ids", _deep_positions),
    "first_level_drawn_k_wide": ("sjd_pac_core.engine.drafters", "Drafter.shaped_tree", _first_level_drawn_k_wide),
    "chain_sibling_repeats_draft": ("sjd_pac_core.sampling.rules", "RejectionRule.chain_candidates",
                                    _chain_sibling_repeats_draft),
    "q_keeps_rejected_mass": ("sjd_pac_core.sampling.verify", "recursive_rejection_rows", _q_keeps_rejected_mass),
    "beside_draft_not_left_out": ("sjd_pac_core.sampling.rules", "RejectionRule.candidates_beside",
                                  _beside_draft_not_left_out),
    "beside_with_replacement": ("sjd_pac_core.sampling.rules", "RejectionRule.candidates_beside",
                                _beside_with_replacement),
    "unseen_rows_verified_against_law": ("sjd_pac_core.engine.drafters", "Drafter.candidates_from_law",
                                         _unseen_rows_verified_against_law),
    "own_row_first_from_next_token": ("sjd_pac_core.engine.drafters", "BudgetDrafter.past_nodes",
                                      _own_row_first_from_next_token),
    "law_unnormalised": ("sjd_pac_core.engine.neighbour_laws", "NeighbourLaws.window_law", _law_unnormalised),
    "mixture_unnormalised": ("sjd_pac_core.sampling.drafting", "rejected_mixture", _mixture_unnormalised),
    "side_candidates_other_noise": ("sjd_pac_core.sampling.rules", "gumbel_top_k_of_logs", _side_candidates_other_noise),
}


SAMPLER_MODULES = ("sjd_pac_core.engine.loop", "sjd_pac_core.generate", "sjd_pac_core.bench.runner")


class FaultCalls:
    """How often the planted fault's seam ran inside the block."""

    def __init__(self) -> None:
        self.count = 0


@contextlib.contextmanager
def planted_edit(owner, attribute: str, old: str, new: str) -> Iterator[FaultCalls]:
    """Plant a bug by editing the source of one function or method (`owner.attribute`, its own
    seam) inside the block: its one occurrence of `old` becomes `new`. Yields a call counter. A
    seam whose source no longer holds `old` fails at once, naming the edit to re-target."""
    original = inspect.getattr_static(owner, attribute)
    function = original.__func__ if isinstance(original, staticmethod) else original
    source = textwrap.dedent(inspect.getsource(function))
    if source.count(old) != 1:
        raise AssertionError(f"planted edit of {attribute}: {old!r} is not in its source once; re-target the edit")
    namespace = dict(function.__globals__)
    flags = __future__.annotations.compiler_flag  # annotations stay text, as in the product's modules
    exec(compile(source.replace(old, new), inspect.getsourcefile(function), "exec", flags, dont_inherit=True), namespace)
    faulty = namespace[function.__name__]
    calls = FaultCalls()

    @functools.wraps(function)
    def counted(*args, **kwargs):
        calls.count += 1
        return faulty(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owner, attribute, staticmethod(counted) if isinstance(original, staticmethod) else counted)
        yield calls


@contextlib.contextmanager
def planted_fault(name: str) -> Iterator[FaultCalls]:
    """Plant the named known bug (see FAULTS) inside the block; yields its call counter."""
    module_name, attribute, make_faulty = FAULTS[name]
    # Import the whole sampler first: a module imported lazily inside the block (the package
    # loads `sample_tokens` on first use) would bind the faulty function by name and keep it
    # after the block, planting the fault in every later test.
    for sampler_module in SAMPLER_MODULES:
        importlib.import_module(sampler_module)
    module = importlib.import_module(module_name)
    owner_path, _, attr = attribute.rpartition(".")
    owner = functools.reduce(getattr, owner_path.split("."), module) if owner_path else module
    if not hasattr(owner, attr):
        raise AssertionError(f"fault {name}: the seam {module_name}.{attribute} is gone; re-target FAULTS")
    original = getattr(owner, attr)
    calls = FaultCalls()
    faulty = make_faulty(original)

    @functools.wraps(original)
    def counted(*args, **kwargs):
        calls.count += 1
        return faulty(*args, **kwargs)

    if isinstance(inspect.getattr_static(owner, attr), staticmethod):
        counted = staticmethod(counted)  # stays a plain function when read through an instance
    targets = [owner]
    if not owner_path:  # a module-level function: also where it was imported by name
        targets += [m for key, m in list(sys.modules.items())
                    if key.startswith("sjd_pac_core") and m is not owner and getattr(m, attr, None) is original]
    with pytest.MonkeyPatch.context() as patch:
        for target in targets:
            patch.setattr(target, attr, counted)
        yield calls

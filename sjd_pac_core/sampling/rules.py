"""The two verification rules as small strategy objects over the pure functions in verify.py.

Both expose the same operations, so the loop never branches on the rule:
  prepare(start)                      the pass verifies positions from `start` on (host int)
  draw(p, positions)                  a token from each row of p (a draft)
  target(p, logits, positions)        the token the model's own row commits, given its p and the
                                      processed logits p is the softmax of
  verify(p, positions, children, drawn_from, logits)
                                      per tree node: which child (in slot order) is accepted,
                                      and the token committed if the walk ends at the node
  candidates(q, first, k, positions)  PD candidates per row: `first`, then k-1 more without
                                      replacement, and which of the k slots are real
  candidates_beside(law, first, k, positions)
                                      the same with the k-1 others from another law (the
                                      draft left out); verify then takes that law as `beside`
                                      where the rule `reads_beside` (rejection does, Gumbel
                                      does not: it also takes the law as logs,
                                      candidates_beside_of_logs, and skips normalising it)
  chain_candidates(...)               the same for many rows at once (the chain siblings)
  continued(children, accepted, next_token)
                                      per node, Adaptive Continuation's draw: the accepted
                                      child's token (the old draft kept), else next_token
Every operation stays on the device: no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Tuple, Union

import torch

from .seeds import reduce_seed
from .drafting import adaptive_continuation, draft_and_ranked
from .verify import (
    beside_validity,
    candidate_validity,
    first_true,
    gumbel_argmax,
    gumbel_argmax_of_logs,
    gumbel_noise,
    gumbel_top_k_of_logs,
    recursive_rejection_rows,
    residual,
    sample,
    sample_without_replacement_rows,
    speculative_accept,
)


@dataclass(frozen=True)
class NodeChildren:
    """The children of every node of one pass, in slot order (device tensors, S nodes, K slots).

    tokens / valid: long / bool [S, K]: child slot k's token, and whether that slot holds a real
    child (False past the node's children or where q had fewer tokens). q_rows: long [S], the
    window position whose proposal q the node's children were drawn from (its depth). single,
    multi, leaves: the nodes with one child, several, none (a pass's shape fixes them), so that
    recursive rejection runs only where there is a choice.
    """

    tokens: torch.Tensor
    valid: torch.Tensor
    q_rows: torch.Tensor
    single: torch.Tensor
    multi: torch.Tensor
    leaves: torch.Tensor


class DrawnFrom(Protocol):
    """The laws a pass's children were drawn from (`engine.draft.Draft` is one), built only for a
    rule that reads them. proposals: [M, V], the window's q's (and own rows'), indexed by
    NodeChildren.q_rows; beside_proposals: [M, V] the laws the slots after the first were drawn
    from (`candidates_beside`; a row equal to q's where they came from q), or None where every
    row's candidates came from q."""

    @property
    def proposals(self) -> torch.Tensor: ...

    @property
    def beside_proposals(self) -> Optional[torch.Tensor]: ...


class RejectionRule:
    """Speculative rejection sampling; exact in distribution."""

    reads_beside = True  # verify weighs the slots beside the draft by the law they were drawn from

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def _uniform(self, shape, device) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, device=device)

    def prepare(self, start: int) -> None:
        pass

    def draw(self, p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return sample(p, self.generator)

    def target(self, p: torch.Tensor, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.draw(p, positions)

    def verify(
        self, p: torch.Tensor, positions: torch.Tensor, children: NodeChildren, drawn_from: DrawnFrom,
        logits: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Speculative acceptance where a node has one child, recursive rejection in slot order
        where it has several (the first accepted wins), a draw from the final residual where
        none is accepted, and a draw from p at a leaf (the bonus token), against the laws the
        children were drawn from (`DrawnFrom`)."""
        q, beside = drawn_from.proposals, drawn_from.beside_proposals
        s = p.shape[0]
        accepted = torch.full((s,), -1, dtype=torch.long, device=p.device)
        next_token = torch.zeros(s, dtype=torch.long, device=p.device)
        if children.single.numel():
            rows = children.single
            p1, q1 = p.index_select(0, rows), q.index_select(0, children.q_rows.index_select(0, rows))
            drafts = children.tokens.index_select(0, rows)[:, 0]
            ok = speculative_accept(p1, q1, drafts, self._uniform(drafts.shape, p.device))
            accepted.index_copy_(0, rows, ok.long() - 1)  # slot 0 or none
            next_token.index_copy_(0, rows, sample(residual(p1, q1), self.generator))
        if children.multi.numel():
            rows = children.multi
            q_rows = children.q_rows.index_select(0, rows)
            accept_prob, final = recursive_rejection_rows(
                p.index_select(0, rows), q.index_select(0, q_rows),
                children.tokens.index_select(0, rows), children.valid.index_select(0, rows),
                None if beside is None else beside.index_select(0, q_rows))
            coins = self._uniform(accept_prob.shape, p.device)
            accepted.index_copy_(0, rows, first_true(coins < accept_prob))
            next_token.index_copy_(0, rows, sample(final, self.generator))
        if children.leaves.numel():
            next_token.index_copy_(0, children.leaves, sample(p.index_select(0, children.leaves), self.generator))
        return accepted, next_token

    def candidates(
        self, q: torch.Tensor, first: torch.Tensor, k: int, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """q [T, V], first long [T] (each row's draft, drawn from it): [T, k] and validity, all
        rows in one Gumbel top-k (no loop over the tree's levels)."""
        return sample_without_replacement_rows(q, first, k, self.generator), candidate_validity(q, k)

    def candidates_beside(
        self, law: torch.Tensor, first: torch.Tensor, k: int, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """law [T, V], first long [T] (each row's draft, drawn from its own q): `first`, then
        k - 1 more drawn without replacement from `law` with `first` left out; verify must get
        `law` as the rows' `beside`."""
        return sample_without_replacement_rows(law, first, k, self.generator), beside_validity(law, first, k)

    def chain_candidates(
        self, q: torch.Tensor, first: torch.Tensor, k: int, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """As `candidates`, for every chain position at once."""
        return self.candidates(q, first, k, positions)

    def continued(self, children: NodeChildren, accepted: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
        """Adaptive Continuation's draw at every node: the accepted child's token, else the
        residual's draw `next_token` (either way a draw from the node's p)."""
        chosen = children.tokens.gather(1, accepted.clamp(min=0).unsqueeze(1)).squeeze(1)
        return adaptive_continuation(chosen, accepted >= 0, next_token)


class GumbelNoiseWindow:
    """The Gumbel noise of the positions a pass may touch, hashed once per position and run.

    Holds the noise of positions [base, base + 2 * chunk) with chunk >= the largest pass span,
    so every position of a pass starting at `start` is inside once prepare(start) has run.
    Moving on by a chunk reuses the upper half: each position is hashed about once per run.
    """

    def __init__(self, seed: int, vocab_size: int, num_tokens: int, span: int, device) -> None:
        self.seed, self.vocab_size, self.num_tokens = seed, vocab_size, num_tokens
        # At least 64 positions: hashing is a few dozen operations per call whatever its size, and a
        # short window's chunk would move on every few passes.
        self.chunk = max(int(span), 64)
        self.device = device
        self.base: Optional[int] = None
        self.noise: Optional[torch.Tensor] = None

    def _hash(self, first: int, last: int) -> torch.Tensor:
        positions = torch.arange(first, max(first, min(last, self.num_tokens)), device=self.device)
        return gumbel_noise(self.seed, positions, self.vocab_size)

    def prepare(self, start: int) -> None:
        base = (start // self.chunk) * self.chunk
        if base == self.base:
            return
        if self.base is not None and base == self.base + self.chunk:
            upper = self.noise[self.chunk :]
            self.noise = torch.cat([upper, self._hash(base + self.chunk, base + 2 * self.chunk)])
        else:
            self.noise = self._hash(base, base + 2 * self.chunk)
        self.base = base

    def rows(self, positions: torch.Tensor) -> torch.Tensor:
        return self.noise.index_select(0, positions - self.base)



class GumbelRule:
    """Seed-exact: token_t = argmax(log p_t + G_t) with G_t fixed by (seed, t).

    A draft is accepted exactly when it equals that argmax under the exact p, so every method
    commits the same tokens as plain AR with the same seed. With a noise window (the sampler's
    case) the noise is hashed once per position; without one, on every call.
    """

    reads_beside = False  # any tokens fixed before the pass are exact: verify never reads their laws

    def __init__(self, seed: int, vocab_size: int, window: Optional[GumbelNoiseWindow] = None) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.window = window

    def prepare(self, start: int) -> None:
        if self.window is not None:
            self.window.prepare(start)

    def _noise(self, positions: torch.Tensor) -> torch.Tensor:
        if self.window is not None and self.window.base is not None:
            return self.window.rows(positions)
        return gumbel_noise(self.seed, positions, self.vocab_size)

    def draw(self, p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return gumbel_argmax(p, self._noise(positions))

    def target(self, p: torch.Tensor, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """argmax(logits + G): log p less its row's constant, so no log of p is taken."""
        return gumbel_argmax_of_logs(logits, self._noise(positions))

    def verify(
        self, p: torch.Tensor, positions: torch.Tensor, children: NodeChildren, drawn_from: DrawnFrom,
        logits: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every node's target argmax(log p + G) at once (from the logits p is the softmax of): a
        child is accepted exactly when its token is its parent's target (children are distinct,
        so at most one is), and the target is what is committed where the walk ends. Any tree is
        exact under this rule, so the laws the children were drawn from are not read (nor built)."""
        target = self.target(p, logits, positions)
        return first_true((children.tokens == target.unsqueeze(-1)) & children.valid), target

    def candidates(
        self, q: torch.Tensor, first: torch.Tensor, k: int, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        # Each draft `first` is already argmax(log q + G); the top-k keeps it first.
        return gumbel_top_k_of_logs(torch.log(q), self._noise(positions), k), candidate_validity(q, k)

    def candidates_beside(
        self, law: torch.Tensor, first: torch.Tensor, k: int, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """`first`, then the k - 1 best tokens of `law` under the position's noise, `first`
        left out: any distinct tokens fixed before the pass are exact here, and these are the
        ones the target is most likely to be."""
        return self.candidates_beside_of_logs(torch.log(law), first, k, positions)

    def candidates_beside_of_logs(
        self, log_law: torch.Tensor, first: torch.Tensor, k: int, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """`candidates_beside` from the law's logs, unnormalised (-inf where it gives nothing)."""
        ranked = gumbel_top_k_of_logs(log_law, self._noise(positions), min(k + 1, int(log_law.shape[-1])))
        # A ranked token is real where the law gives it anything: the noise is finite, so those
        # rank before every -inf, and the rest are padding.
        return draft_and_ranked(first, ranked, log_law.gather(-1, ranked) > float("-inf"), k)

    def chain_candidates(
        self, q: torch.Tensor, first: torch.Tensor, k: int, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.candidates(q, first, k, positions)  # already one op over all rows

    def continued(self, children: NodeChildren, accepted: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
        """Adaptive Continuation's draw: the target itself, at every node (a child is accepted
        only when its token is the target, so keeping it is taking the target)."""
        return next_token


def make_rule(
    verify: str, seed: int, vocab_size: int, device: torch.device,
    num_tokens: Optional[int] = None, span: Optional[int] = None,
) -> Union[RejectionRule, GumbelRule]:
    """The rule for `verify`. With num_tokens and span (the most positions one pass touches),
    the Gumbel rule keeps a noise window instead of re-hashing the noise on every call."""
    seed = reduce_seed(seed)  # one seed domain for both rules (seeds.py)
    if verify == "gumbel":
        window = None
        if num_tokens is not None and span is not None:
            window = GumbelNoiseWindow(seed, vocab_size, num_tokens, span, device)
        return GumbelRule(seed, vocab_size, window)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return RejectionRule(generator)

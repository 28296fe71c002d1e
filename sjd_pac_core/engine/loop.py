"""sample_tokens: the decoding loop shared by plain AR, SJD and SJD-PAC.

Plain AR is SJD with an empty window. SJD-PAC adds Adaptive Continuation (keep drafts after the
first rejection, coupled to the stale p) and Proactive Drafting (a tree of candidates after the
rejection point). Each iteration: one forward pass, a handful of tensor ops, one host sync.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import torch

from ..config import ConfigError, SamplerConfig
from ..models.base import TokenModel
from ..models.causal_lm import as_token_model
from ..sampling.drafting import adaptive_continuation, candidate_count, initial_proposals
from ..sampling.recipe import SamplingRecipe, TokenConstraints, process
from ..sampling.rules import make_rule
from ..sampling.tree import TreeLayout, build_tree_layout
from .inputs import check_sample_inputs
from .state import DecodeState, DraftWindow, PassOutcome
from .stats import PassRecord, RunStats
from .window import AutoWindow, FixedWindow, measure_cost_curve


class GenerationCancelled(RuntimeError):
    """Raised by a callback to stop sampling; the cache is freed on the way out."""


@dataclass
class Progress:
    """What a callback sees after every forward pass."""

    record: PassRecord
    stats: RunStats
    tokens: torch.Tensor  # the committed tokens so far (on the model's device)
    num_tokens: int


@dataclass
class SampleResult:
    tokens: torch.Tensor  # long [num_tokens], on the CPU
    stats: RunStats
    config: SamplerConfig
    seed: int


Callback = Callable[[Progress], None]


def sample_tokens(
    model: object,
    prompt_ids: torch.Tensor,
    num_tokens: int,
    config: Union[None, SamplerConfig, Mapping[str, Any]] = None,
    seed: Optional[int] = 0,
    uncond_prompt_ids: Optional[torch.Tensor] = None,
    allowed_tokens: Union[None, torch.Tensor, Sequence[int], TokenConstraints] = None,
    callback: Optional[Callback] = None,
) -> SampleResult:
    """Sample num_tokens tokens after prompt_ids, exactly as plain AR sampling would.

    model: a transformers causal LM, a TokenModel adapter, or a model from load_model.
    prompt_ids, uncond_prompt_ids: one prompt each, token ids as a 1-D LongTensor (or list).
    config: a SamplerConfig, or a dict of its fields (validated into one).
    seed: any integer, reduced to 64 bits (sampling/seeds.py); None draws a random seed, which
        the result reports in `seed`.
    allowed_tokens: a mask [V] or [num_tokens, V] (bool, or 0/1 of any dtype), a list of ids,
        or TokenConstraints (which also carries forced tokens such as end-of-line).
    callback: called with a Progress after every forward pass; raise GenerationCancelled (or
        anything) in it to stop.
    Every argument is checked before any work (engine/inputs.py): a ConfigError names the one
    that is wrong.
    """
    token_model = as_token_model(model)
    inputs = check_sample_inputs(
        token_model, prompt_ids, num_tokens, config, seed, uncond_prompt_ids, allowed_tokens, callback
    )
    with torch.inference_mode():
        return _Decoder(token_model, inputs.config, inputs.seed, inputs.constraints).run(inputs.prompts, inputs.callback)


class _Decoder:
    """One run of the loop. Holds the run's constants; DecodeState holds what changes."""

    def __init__(
        self, model: TokenModel, config: SamplerConfig, seed: int, constraints: TokenConstraints
    ) -> None:
        self.model = model
        self.config = config
        self.device = model.device
        self.constraints = constraints.to(self.device)
        self.recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
        self.rule = make_rule(config.verify, seed, model.vocab_size, self.device)
        self.seed = seed
        self.window_policy = FixedWindow(config.window_size)  # replaced after the prefill if "auto"

    # --- small helpers ----------------------------------------------------------------------
    def _positions(self, start: int, count: int) -> torch.Tensor:
        return torch.arange(start, start + count, device=self.device)

    def _new_drafts(self, state_logits: torch.Tensor, start: int, count: int) -> DraftWindow:
        positions = self._positions(start, count)
        q = initial_proposals(state_logits, positions, self.recipe, self.constraints, self.config.init_proposal)
        return DraftWindow(self.rule.draw(q, positions), q)

    def _window_target(self, num_committed: int) -> int:
        return min(self.window_policy.next_window(), self.constraints.num_tokens - num_committed)

    # --- the run ----------------------------------------------------------------------------
    def run(self, prompts: List[torch.Tensor], callback: Optional[Callback]) -> SampleResult:
        n_tokens = self.constraints.num_tokens
        stats = RunStats(num_tokens=n_tokens, method=self.config.method)
        session = self.model.open_session(prompts)
        try:
            state = self._prefill(session, stats, callback)
            while not state.done:
                self._iterate(state, stats, callback)
            tokens = state.committed.cpu()
        finally:
            session.close()  # frees the KV cache on every exit, interrupts included
        return SampleResult(tokens=tokens, stats=stats, config=self.config, seed=self.seed)

    def _prefill(self, session, stats: RunStats, callback: Optional[Callback]) -> DecodeState:
        start = time.perf_counter()
        logits = session.prefill()  # [B, V]
        forward_time = time.perf_counter() - start
        pos0 = self._positions(0, 1)
        p0 = process(logits.unsqueeze(1), pos0, self.recipe, self.constraints)
        committed = torch.zeros(self.constraints.num_tokens, dtype=torch.long, device=self.device)
        committed[0] = self.rule.draw(p0, pos0)[0]
        if self.config.auto_window:
            cost = measure_cost_curve(self.model, session, committed[0])
            self.window_policy = AutoWindow(cost, extra_nodes=self.config.tree_side_nodes)
        state = DecodeState(
            session=session,
            committed=committed,
            num_committed=1,
            window=self._new_drafts(logits, 1, self._window_target(1)),
            proposal_logits=logits,
        )
        self._record(state, stats, callback, start, forward_time, committed=1, window=0,
                     tree_nodes=0, first_reject=-1, kept_by_ac=0, branch=())
        return state

    def _iterate(self, state: DecodeState, stats: RunStats, callback: Optional[Callback]) -> None:
        start = time.perf_counter()
        n, n_tokens = state.num_committed, state.num_tokens
        window, tree = state.window, state.tree
        m = len(window)

        # 1. Lay out the pass: root, PD levels, chain of the remaining drafts.
        layout = build_tree_layout(tuple(int(c.shape[0]) for c in tree), m - len(tree))
        tokens = self._node_tokens(state, layout)

        # 2. One forward pass; node at depth d predicts image position n + d.
        fwd_start = time.perf_counter()
        logits = state.session.forward(tokens, layout.depths.to(self.device), layout.attend)
        forward_time = time.perf_counter() - fwd_start
        depths = layout.depths.to(self.device)
        probs = process(logits, (n + depths).clamp(max=n_tokens - 1), self.recipe, self.constraints)

        # 3. Verify every draft on the main branch at once; these flags also drive AC later.
        main = layout.main_path.to(self.device)
        p_main = probs[main]  # [m + 1, V]; row j is p for draft j, row m for the bonus
        pos_main = self._positions(n, m + 1).clamp(max=n_tokens - 1)
        accepted, replacements = self.rule.chain(p_main[:m], window.q, window.tokens, pos_main[:m])
        bonus = self.rule.draw(p_main[m:], pos_main[m:]) if n + m < n_tokens else None

        # 4. PD levels: recursive rejection for every parent of every level, then the leaves.
        level_first, level_fallback = [], []
        for d in range(layout.levels):
            parents = list(layout.level_nodes(d))
            first, fallback = self.rule.level(probs[parents], window.q[d], tree[d], n + d)
            level_first.append(first)
            level_fallback.append(fallback)
        leaf = self._leaf_checks(layout, probs, window, n, n_tokens)

        # 5. One host sync for all decisions, then walk the accepted path.
        flags = [accepted.long()] + level_first + ([leaf[0].long()] if leaf else [])
        host = torch.cat(flags).tolist() if flags else []
        outcome = self._walk(layout, host, m, level_fallback, replacements, bonus, leaf, window)

        # 6. Commit the path and the final token; keep only the path's cache entries.
        a = outcome.accepted
        if a:
            state.committed[n : n + a] = tokens[outcome.path_nodes]
        new_n = n + a
        if outcome.final is not None:
            state.committed[new_n] = outcome.final
            new_n += 1
        state.session.keep([0] + outcome.path_nodes)

        self.window_policy.observe(a, censored=not outcome.rejected, window=m)

        # 7. Redraft the drafts after the final token against this pass's stale p: AC keeps the
        #    accepted ones, plain SJD draws them afresh. Either way q becomes the stale p.
        rest = slice(a + 1, m)
        kept_by_ac = 0
        if new_n < n_tokens and a + 1 < m:
            if self.config.use_ac:
                new_tokens = adaptive_continuation(window.tokens[rest], accepted[rest], replacements[rest])
                kept_by_ac = sum(host[a + 1 : m])
            else:
                new_tokens = self.rule.draw(p_main[rest], pos_main[rest])
            next_window = DraftWindow(new_tokens, p_main[rest])
        else:
            next_window = DraftWindow(window.tokens[:0], window.q[:0])

        # 8. Fill the window up to L with fresh drafts from the furthest stale logits.
        state.proposal_logits = logits[:, int(layout.main_path[-1])]
        missing = self._window_target(new_n) - len(next_window)
        if new_n < n_tokens and missing > 0:
            fresh = self._new_drafts(state.proposal_logits, new_n + len(next_window), missing)
            next_window = next_window.extend(fresh.tokens, fresh.q)
        state.window, state.num_committed = next_window, new_n

        # 9. Proactive Drafting: a tree of candidates at the positions after a rejection.
        state.tree = self._build_tree(next_window, new_n) if outcome.rejected and self.config.use_pd else []

        self._record(state, stats, callback, start, forward_time, committed=new_n - n, window=m,
                     tree_nodes=layout.num_nodes - 1 - m, first_reject=a if outcome.rejected else -1,
                     kept_by_ac=kept_by_ac, branch=outcome.branch)

    # --- pieces of an iteration -------------------------------------------------------------
    def _node_tokens(self, state: DecodeState, layout: TreeLayout) -> torch.Tensor:
        parts = [state.root_token.reshape(1)]
        parents = 1
        for candidates in state.tree:  # one entry per PD level (D - 1 of them)
            parts.append(candidates.repeat(parents))
            parents *= int(candidates.shape[0])
        parts.append(state.window.tokens[layout.levels :])
        return torch.cat(parts)

    def _leaf_checks(self, layout: TreeLayout, probs, window: DraftWindow, n: int, n_tokens: int):
        """For a path that leaves the main branch: the leaf's p is exact for the next position.

        With a chain beyond the tree, verify its first draft against that p; otherwise draw the
        bonus from it. Computed for every leaf so that no sync is needed before the walk.
        """
        if layout.levels == 0:
            return None
        leaves = list(layout.level_nodes(layout.levels))
        p_leaf = probs[leaves]
        d = layout.levels
        pos = torch.full((len(leaves),), min(n + d, n_tokens - 1), device=self.device)
        if len(window) > d:
            q = window.q[d].expand(len(leaves), -1)
            return self.rule.chain(p_leaf, q, window.tokens[d].expand(len(leaves)), pos)
        if n + d < n_tokens:
            return torch.zeros(len(leaves), dtype=torch.bool, device=self.device), self.rule.draw(p_leaf, pos)
        return None

    def _walk(self, layout: TreeLayout, host: List[int], m: int, level_fallback, replacements,
              bonus, leaf, window: DraftWindow) -> PassOutcome:
        accepted_flags = host[:m]
        level_first = host[m : m + sum(len(layout.level_nodes(d)) for d in range(layout.levels))]
        leaf_flags = host[len(host) - len(layout.level_nodes(layout.levels)) :] if leaf else []

        path: List[int] = []
        branch: List[int] = []
        local, offset = 0, 0
        for d in range(layout.levels):  # at most D - 1 levels
            n_parents = len(layout.level_nodes(d))
            k = level_first[offset + local]
            offset += n_parents
            if k < 0:  # every candidate rejected: commit the draw from the final residual
                return PassOutcome(path, d, level_fallback[d][local], True, tuple(branch))
            local = local * int(layout.widths[d]) + k
            path.append(layout.level_offsets[d + 1] + local)
            branch.append(k)

        d = layout.levels
        if any(branch):  # left the main branch: only the leaf's own p is exact
            if leaf is None:
                return PassOutcome(path, d, None, False, tuple(branch))
            if d < m and leaf_flags[local]:
                return PassOutcome(path, d, window.tokens[d], False, tuple(branch))
            return PassOutcome(path, d, leaf[1][local], d < m, tuple(branch))

        # Main branch: continue along the chain until its first rejection.
        chain_flags = accepted_flags[d:]
        run = chain_flags.index(0) if 0 in chain_flags else len(chain_flags)
        path.extend(layout.main_nodes[d + 1 : d + 1 + run])
        j = d + run
        if j < m:
            return PassOutcome(path, j, replacements[j], True, tuple(branch))
        return PassOutcome(path, j, bonus[0] if bonus is not None else None, False, tuple(branch))

    def _build_tree(self, window: DraftWindow, n: int) -> List[torch.Tensor]:
        levels = min(self.config.tree_depth - 1, len(window))
        if levels <= 0:
            return []
        widths = candidate_count(window.q[:levels], self.config.tree_width).tolist()
        return [
            self.rule.candidates(window.q[d], window.tokens[d], int(widths[d]), n + d)
            for d in range(levels)  # D - 1 levels, a handful
        ]

    def _record(self, state: DecodeState, stats: RunStats, callback: Optional[Callback], start: float,
                forward_time: float, **fields) -> None:
        record = PassRecord(index=len(stats.records), total_committed=state.num_committed,
                            wall_time=time.perf_counter() - start, forward_time=forward_time, **fields)
        stats.records.append(record)
        if callback is not None:
            callback(Progress(record, stats, state.committed[: state.num_committed], state.num_tokens))

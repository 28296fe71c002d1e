"""sample_tokens: the decoding loop shared by plain AR, SJD and SJD-PAC.

Plain AR is SJD with an empty window. SJD-PAC adds Adaptive Continuation (keep drafts after the
first rejection, coupled to the stale p) and Proactive Drafting (a tree of candidates after the
rejection point). A pass is a fixed sequence of typed stages:

    plan     the draft (window + tree) laid out as one fixed-shape batch of nodes (PassPlan)
    forward  one model pass over the nodes on top of the KV cache
    verify   every decision of the pass on the device (Verdict)
    sync     the decisions to the host: the pass's one host sync (Decisions)
    walk     a pure function of those host values: the accepted path (PassOutcome)
    commit   the path's tokens and the final token; the cache keeps the path's entries
    draft    the Drafter strategy makes the next pass's draft (drafters.py)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..config import SamplerConfig
from ..models.base import TokenModel
from ..models.causal_lm import as_token_model
from ..sampling import rules
from ..sampling.constraint_table import ConstraintTable
from ..sampling.recipe import SamplingRecipe, TokenConstraints, process
from ..sampling.tree import TreeLayout, build_tree_layout
from . import drafters
from .drafters import Draft, DraftContext, PassReport
from .inputs import check_sample_inputs
from .state import DecodeState
from .stats import PassRecord, RunStats
from .sync import SyncCounter, copy_to_device, synchronize, to_device
from .timing import ForwardTimer
from .verdict import PassOutcome, Verdict, stale_rows, walk
from .window import (AUTO_START_WINDOW, CANDIDATE_WINDOWS, COMPILED_CANDIDATE_WINDOWS, PROBE_SIZES, AutoWindow,
                     FixedWindow, measure_cost_curve)


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


@dataclass(frozen=True)
class PassShape:
    """A pass layout padded to its fixed envelope, on the device; built once per shape and run.

    Nodes beyond the layout's are padding: token 0 at the root's position, seeing only
    themselves, never read. The node tokens of a pass are one gather from
    [root, tree candidates (row-major), chain drafts, padding token] by `token_source` (a side
    chain's nodes gather the chain's first drafts).
    """

    layout: TreeLayout
    envelope: int
    depths: torch.Tensor  # long [E]
    attend: torch.Tensor  # bool [E, E]
    token_source: torch.Tensor  # long [E]
    main: torch.Tensor  # long [m + 1]: main-branch node at each depth
    parent_level: torch.Tensor  # long [P]: the level of tree parent node i (nodes 0..P-1)
    row_nodes: torch.Tensor  # long [R]: the node whose p verifies each leaf row
    draft_rows: torch.Tensor  # long [R']: leaf rows that verify a chain draft
    draft_offsets: torch.Tensor  # long [R']: their draft's offset r in the chain (window levels + r)
    bonus_rows: torch.Tensor  # long [R'']: leaf rows past the window's last draft (a draw from p)

    @staticmethod
    def build(widths: Tuple[int, ...], chain_len: int, envelope: int, device: torch.device,
              side_leaves: Tuple[int, ...] = (), side_len: int = 0) -> "PassShape":
        layout = build_tree_layout(widths, chain_len, side_leaves, side_len)
        s, levels = layout.num_nodes, layout.levels
        width = max(widths) if widths else 1
        pad = envelope - s
        side = layout.side_chain_nodes
        num_tree = s - chain_len - side
        chain_source = 1 + levels * width
        side_source = [chain_source + r for _ in layout.side_leaves for r in range(layout.side_len)]
        source = torch.cat([
            torch.zeros(1, dtype=torch.long),
            1 + (layout.depths[1:num_tree] - 1) * width + layout.candidate_index[1:num_tree],
            chain_source + torch.arange(chain_len),
            torch.tensor(side_source, dtype=torch.long),
            torch.full((pad,), chain_source + chain_len, dtype=torch.long),
        ])
        attend = torch.eye(envelope, dtype=torch.bool)
        attend[:s, :s] = layout.attend
        depths = torch.cat([layout.depths, torch.zeros(pad, dtype=torch.long)])
        parents = layout.level_offsets[levels] if levels else 0
        offsets = layout.row_offsets
        draft_rows = [i for i, r in enumerate(offsets) if r < chain_len]
        bonus_rows = [i for i, r in enumerate(offsets) if r >= chain_len]
        return PassShape(
            layout=layout, envelope=envelope, depths=copy_to_device(depths, device),
            attend=copy_to_device(attend, device), token_source=copy_to_device(source, device),
            main=copy_to_device(layout.main_path, device),
            parent_level=copy_to_device(layout.depths[:parents], device),
            row_nodes=copy_to_device(torch.tensor(layout.row_nodes, dtype=torch.long), device),
            draft_rows=copy_to_device(torch.tensor(draft_rows, dtype=torch.long), device),
            draft_offsets=copy_to_device(torch.tensor([offsets[i] for i in draft_rows], dtype=torch.long), device),
            bonus_rows=copy_to_device(torch.tensor(bonus_rows, dtype=torch.long), device),
        )


@dataclass(frozen=True)
class PassPlan:
    """Stage 1's result: what the pass feeds and how its nodes relate to the draft."""

    shape: PassShape
    draft: Draft
    start: int  # n, committed tokens before the pass
    tokens: torch.Tensor  # long [E], the node tokens (padding included)


class _Decoder:
    """One run of the loop. Holds the run's constants; DecodeState holds what changes."""

    def __init__(
        self, model: TokenModel, config: SamplerConfig, seed: int, constraints: TokenConstraints
    ) -> None:
        self.model = model
        self.config = config
        self.device = model.device
        self.num_tokens = constraints.num_tokens
        self.constraints = ConstraintTable(constraints, self.device)  # masks built once per run
        self.recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
        self.drafter = drafters.make_drafter(config)  # looked up per run: the strategy seam
        # The auto window's choices: a compiled run keeps to a few sizes (one graph each).
        self.candidates = COMPILED_CANDIDATE_WINDOWS if config.compile else CANDIDATE_WINDOWS
        largest_window = config.window if isinstance(config.window, int) else max(self.candidates)
        self.largest_window = largest_window if config.method != "ar" else 0
        span = largest_window + config.tree_depth + 2  # the most positions one pass touches
        self.rule = rules.make_rule(config.verify, seed, model.vocab_size, self.device,
                                    num_tokens=self.num_tokens, span=span)
        self.seed = seed
        self.window_policy = FixedWindow(config.window_size)  # replaced after the prefill if "auto"
        self.positions = torch.arange(self.num_tokens + span + self.drafter.max_side_nodes + 2, device=self.device)
        self.ctx = DraftContext(self.rule, self.recipe, self.constraints, self.num_tokens,
                                config.init_proposal, self.positions)
        self.shapes: Dict[Tuple[Tuple[int, ...], int, int], PassShape] = {}
        self.timer = ForwardTimer(self.device)

    def _window_target(self, num_committed: int) -> int:
        return min(self.window_policy.next_window(), self.num_tokens - num_committed)

    # --- the run ----------------------------------------------------------------------------
    def run(self, prompts: List[torch.Tensor], callback: Optional[Callback]) -> SampleResult:
        stats = RunStats(num_tokens=self.num_tokens, method=self.config.method)
        session = self.model.open_session(prompts)
        try:
            # Size the cache once: the image, the largest pass and the auto window's probe.
            largest_pass = 1 + self.largest_window + self.drafter.max_side_nodes
            # A compiled run's cache capacity must be set here, before the prefill, so that every
            # prompt length lands on one capacity and one graph per pass size.
            session.configure(self.num_tokens + max(largest_pass, max(PROBE_SIZES)) + 1,
                              vocabulary=self.constraints.rows.any(0), compile=self.config.compile)
            state = self._prefill(session, stats, callback)  # and the auto window's eager probe
            if self.config.compile:
                session.start_compiled()
                stats.warmup_time = self._warm_up(state)
            while not state.done:
                self._iterate(state, stats, callback)
            tokens = state.committed.cpu()
        finally:
            session.close()  # frees the KV cache on every exit, interrupts included
        return SampleResult(tokens=tokens, stats=stats, config=self.config, seed=self.seed)

    def _prefill(self, session, stats: RunStats, callback: Optional[Callback]) -> DecodeState:
        start, syncs = time.perf_counter(), SyncCounter.count
        self.timer.start()
        logits = session.prefill()  # [B, V]
        self.timer.stop()
        pos0 = self.positions[:1]
        self.rule.prepare(0)
        p0 = process(logits.unsqueeze(1), pos0, self.recipe, self.constraints)
        committed = torch.zeros(self.num_tokens, dtype=torch.long, device=self.device)
        committed[:1] = self.rule.draw(p0, pos0)
        if self.config.auto_window and self.config.compile:
            self.window_policy = FixedWindow(AUTO_START_WINDOW)  # until the warm-up times the graphs
        elif self.config.auto_window:
            cost = measure_cost_curve(self.model, session, committed[0])
            self.window_policy = AutoWindow(cost, extra_nodes=self.config.tree_side_nodes)
        target = self._window_target(1)
        self.rule.prepare(1)
        draft = self.drafter.first(self.ctx, logits, 1, target)
        synchronize(self.device)  # the prefill's timing (its one sync)
        SyncCounter.count += 1
        state = DecodeState(session=session, committed=committed, num_committed=1, draft=draft, target=target)
        self._record(state, stats, callback, start, syncs, committed=1, window=0, tree_nodes=0,
                     first_reject=-1, kept_by_ac=0, branch=(), envelope=0)
        return state

    def _iterate(self, state: DecodeState, stats: RunStats, callback: Optional[Callback]) -> None:
        start, syncs, moved = time.perf_counter(), SyncCounter.count, state.session.compaction_bytes
        plan = self._plan(state)
        logits = self._forward(state, plan)
        verdict = self._verify(state, plan, logits)
        decisions = verdict.decisions()  # the pass's one host sync
        window, layout = plan.draft.window, plan.shape.layout
        outcome = walk(layout, decisions, len(window), has_bonus=verdict.bonus.numel() > 0)
        n = state.num_committed
        self._commit(state, plan, verdict, outcome)
        self.window_policy.observe(outcome.accepted, censored=not outcome.rejected, window=len(window),
                                   tree_levels=layout.levels)
        if not state.done:
            target = self._window_target(state.num_committed)
            self.rule.prepare(state.num_committed)
            report = PassReport(start=n, num_committed=state.num_committed, target=target, draft=plan.draft,
                                outcome=outcome, decisions=decisions, verdict=verdict,
                                proposal_logits=logits[:, layout.main_nodes[-1]],
                                stale=stale_rows(layout, verdict, decisions, outcome, len(window)))
            state.draft, state.target = self.drafter.next(self.ctx, report), target
        self._record(state, stats, callback, start, syncs, committed=state.num_committed - n,
                     window=len(window), tree_nodes=layout.num_nodes - 1 - len(window),
                     first_reject=outcome.accepted if outcome.rejected else -1,
                     kept_by_ac=state.draft.kept_by_ac if not state.done else 0, branch=outcome.branch,
                     envelope=plan.shape.envelope, compaction_bytes=state.session.compaction_bytes - moved)

    def _warm_up(self, state: DecodeState) -> float:
        """Compile the pass shapes this run will use (chain and tree passes of the window),
        outside the timed passes: each runs on the live cache and is rolled back. With
        window="auto" that is every candidate window, timed compiled for the auto window's cost
        curve."""
        start = time.perf_counter()
        side = self.drafter.max_side_nodes
        if self.config.auto_window:
            windows = self.candidates
        else:
            windows = (max(self.window_policy.next_window(), len(state.draft.window)),)
        sizes = sorted({1 + w + extra for w in windows for extra in {0, side}})
        for size in [s for s in sizes if not state.session.compiled_shape_ready(s)]:
            # two shapes for a fixed window (chain and tree passes); none on a repeat run
            tokens = state.committed[:1].expand(size).contiguous()
            eye = torch.eye(size, dtype=torch.bool, device=self.device)
            state.session.forward(tokens, torch.zeros_like(tokens), eye)
            state.session.keep([])  # the warm-up leaves the cache exactly as it was
        if self.config.auto_window:  # the graphs exist now: time them for the cost curve
            cost = measure_cost_curve(self.model, state.session, state.committed[0], sizes, compiled=True)
            self.window_policy = AutoWindow(cost, extra_nodes=side, candidates=self.candidates)
        synchronize(self.device)
        return time.perf_counter() - start

    def _envelope_window(self, drafts: int) -> int:
        """The window a pass of `drafts` drafts is padded to: itself, or on a compiled auto run
        the smallest candidate that holds it (a compiled graph exists only for those)."""
        if self.config.compile and self.config.auto_window:
            return min((w for w in self.candidates if w >= drafts), default=drafts)
        return drafts

    # --- the stages -------------------------------------------------------------------------
    def _plan(self, state: DecodeState) -> PassPlan:
        """Lay out root, PD levels and chain as one batch padded to the pass's fixed envelope:
        1 + L for a chain pass, 1 + L + the drafter's largest tree for a tree pass."""
        draft = state.draft
        window, tree = draft.window, draft.tree
        widths = tree.widths if tree is not None else ()
        levels = len(widths)
        side = self.drafter.max_side_nodes if tree is not None else 0
        side_leaves, side_len = (tree.side_leaves, tree.side_len) if tree is not None else ((), 0)
        # The policy's window, not the positions left: the shape stays fixed up to the image's end.
        envelope = 1 + self._envelope_window(max(self.window_policy.next_window(), len(window))) + side
        key = (widths, len(window) - levels, envelope, side_leaves, side_len)
        shape = self.shapes.get(key)
        if shape is None:  # a handful of shapes per run (chain / tree passes, the image's end)
            shape = self.shapes[key] = PassShape.build(widths, len(window) - levels, envelope, self.device,
                                                       side_leaves, side_len)
        parts = [state.root_token]
        if tree is not None:
            parts.append(tree.candidates.reshape(-1))
        parts += [window.tokens[levels:], state.root_token.new_zeros(1)]
        tokens = torch.cat(parts).index_select(0, shape.token_source)
        return PassPlan(shape=shape, draft=draft, start=state.num_committed, tokens=tokens)

    def _forward(self, state: DecodeState, plan: PassPlan) -> torch.Tensor:
        """One model pass; node at depth d predicts image position n + d. Logits [B, E, V]."""
        self.timer.start()
        logits = state.session.forward(plan.tokens, plan.shape.depths, plan.shape.attend)
        self.timer.stop()
        return logits

    def _verify(self, state: DecodeState, plan: PassPlan, logits: torch.Tensor) -> Verdict:
        """Every decision of the pass, on the device: the main chain, every PD level at once,
        and each leaf's check (so that no sync is needed before the walk)."""
        n, last = plan.start, self.num_tokens - 1
        layout, window, tree = plan.shape.layout, plan.draft.window, plan.draft.tree
        m, levels, s = len(window), layout.levels, layout.num_nodes
        self.rule.prepare(n)
        probs = process(logits[:, :s], (n + plan.shape.depths[:s]).clamp(max=last), self.recipe, self.constraints)

        p_main = probs.index_select(0, plan.shape.main)  # row j is p for draft j, row m for the bonus
        pos_main = self.positions[n : n + m + 1].clamp(max=last)
        accepted, replacements = self.rule.chain(p_main[:m], window.q, window.tokens, pos_main[:m])
        none = self.positions[:0]
        bonus = self.rule.draw(p_main[m:], pos_main[m:]) if n + m < self.num_tokens else none

        first_child = fallback = leaf_token = none
        leaf_accepted, p_rows = none.bool(), None
        if levels:
            lvl = plan.shape.parent_level
            parents = int(lvl.shape[0])
            first_child, fallback = self.rule.level(
                probs[:parents], window.q.index_select(0, lvl), tree.candidates.index_select(0, lvl),
                tree.valid.index_select(0, lvl), (n + lvl).clamp(max=last),
            )
            # Leaf rows: the chain's drafts checked against each leaf's own p and its side chain's.
            rows = int(plan.shape.row_nodes.shape[0])
            p_rows = probs.index_select(0, plan.shape.row_nodes)
            leaf_accepted = torch.zeros(rows, dtype=torch.bool, device=self.device)
            leaf_token = torch.zeros(rows, dtype=torch.long, device=self.device)
            draft_rows, offsets = plan.shape.draft_rows, plan.shape.draft_offsets
            if draft_rows.numel():
                drafts = levels + offsets
                pos = (n + drafts).clamp(max=last)
                acc, tok = self.rule.chain(p_rows.index_select(0, draft_rows), window.q.index_select(0, drafts),
                                           window.tokens.index_select(0, drafts), pos)
                leaf_accepted[draft_rows], leaf_token[draft_rows] = acc, tok
            bonus_rows = plan.shape.bonus_rows
            if bonus_rows.numel() and n + m < self.num_tokens:  # past the window: a draw from p
                pos = self.positions[n + m : n + m + 1].expand(int(bonus_rows.shape[0]))
                leaf_token[bonus_rows] = self.rule.draw(p_rows.index_select(0, bonus_rows), pos)
        return Verdict(chain_accepted=accepted, chain_token=replacements, bonus=bonus,
                       first_child=first_child, fallback=fallback, leaf_accepted=leaf_accepted,
                       leaf_token=leaf_token, p_main=p_main, positions_main=pos_main, p_rows=p_rows)

    def _commit(self, state: DecodeState, plan: PassPlan, verdict: Verdict, outcome: PassOutcome) -> None:
        """Commit the path and the final token; keep only the path's cache entries."""
        n, a = plan.start, outcome.accepted
        if a:
            path = to_device(outcome.path_nodes, self.device)
            state.committed[n : n + a] = plan.tokens.index_select(0, path)
        new_n = n + a
        if outcome.final is not None:
            final = outcome.final
            state.committed[new_n : new_n + 1] = verdict.token(final.source, final.index, plan.draft.window.tokens)
            new_n += 1
        state.session.keep([0, *outcome.path_nodes])
        state.num_committed = new_n

    def _record(self, state: DecodeState, stats: RunStats, callback: Optional[Callback], start: float,
                syncs: int, **fields) -> None:
        record = PassRecord(index=len(stats.records), total_committed=state.num_committed,
                            wall_time=time.perf_counter() - start, forward_time=self.timer.seconds(),
                            host_syncs=SyncCounter.count - syncs, **fields)
        stats.records.append(record)
        if callback is not None:
            callback(Progress(record, stats, state.committed[: state.num_committed], state.num_tokens))

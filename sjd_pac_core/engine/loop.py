"""sample_tokens: the decoding loop shared by plain AR, SJD and SJD-PAC.

Plain AR is SJD with an empty window. SJD-PAC adds Adaptive Continuation (keep drafts after the
first rejection, coupled to the stale p) and Proactive Drafting (a tree of candidates after the
rejection point). A pass is a fixed sequence of typed stages:

    plan     the draft (window + tree) laid out as one fixed-shape batch of nodes (PassPlan)
    forward  one model pass over the nodes on top of the KV cache
    verify   every decision of the pass on the device (Verdict)
    sync     the decisions to the host: the pass's one host sync (Decisions), which also says
             whether any p is NaN or infinite (then the run stops: finite.py)
    walk     a pure function of those host values: the accepted path (PassOutcome)
    commit   the path's tokens and the final token; the cache keeps the path's entries
    draft    the Drafter strategy makes the next pass's draft (drafters.py)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..bounded_cache import MIB, bounded_by_bytes, field_tensor_bytes
from ..config import SamplerConfig
from ..models.base import TokenModel
from ..models.causal_lm import as_token_model
from ..sampling import rules
from ..sampling.constraint_table import ConstraintTable
from ..sampling.recipe import SamplingRecipe, TokenConstraints, processed_logits
from ..sampling.rules import NodeChildren
from ..sampling.tree import TreeLayout, layout_bytes
from ..transfer import arrays_to_device, copy_to_device, to_device
from . import drafters
from .drafters import Draft, DraftContext, PassReport
from .finite import NonFiniteError, first_non_finite, non_finite_error, non_finite_row
from .inputs import check_sample_inputs
from .state import DecodeState
from .stats import PassRecord, RunStats
from .sync import SyncCounter, fetch, synchronize
from .timing import ForwardTimer, stage
from .verdict import PassOutcome, StaleRows, Verdict, continuation, walk
from .window import (AUTO_START_WINDOW, CANDIDATE_WINDOWS, COMPILED_CANDIDATE_WINDOWS, PROBE_SIZES, AutoTreeWindow,
                     AutoWindow, FixedWindow, measure_cost_curve, narrower_trees)


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
    seed: 0 .. 2**64-1; None or -1 draws a random seed, which the result reports in `seed`
        (sampling/seeds.py).
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
    """A pass's tree padded to its fixed envelope, on the device; built once per shape and run.

    Nodes beyond the tree's are padding: token 0 at the root's position, seeing only themselves,
    never read. The node tokens of a pass are one gather from its flat token source
    [root, tree candidates (row-major, K per row: the position rows, then the own rows), window
    drafts, padding token] by `token_source`; the children of every node (for verification) are
    one gather from the same source by `child_source`, and their validity from the matching flat
    validity mask.
    """

    layout: TreeLayout
    envelope: int
    levels: int  # candidate rows the source holds (T)
    depths: torch.Tensor  # long [E]
    attend: torch.Tensor  # bool [E, E]
    token_source: torch.Tensor  # long [E]
    child_source: torch.Tensor  # long [S, K]: each node's children by slot (the padding index past them)
    q_rows: torch.Tensor  # long [S]: the row of the draft's proposals each node's children were drawn from
    single: torch.Tensor  # long: the nodes with one child, several, none (NodeChildren's groups)
    multi: torch.Tensor
    leaves: torch.Tensor

    @staticmethod
    def build(layout: TreeLayout, levels: int, width: int, window: int, envelope: int,
              device: torch.device) -> "PassShape":
        s = layout.num_nodes
        pad = envelope - s
        owners = np.full(s, -1, dtype=np.int64)  # node -> its own row (-1: none)
        if layout.own_rows:  # the few nodes that own a proposal, found by their paths
            index = {path: node for node, path in enumerate(((),) + layout.shape.paths)}
            owners[[index[owner] for owner in layout.own_rows]] = np.arange(len(layout.own_rows))
        rows = levels + len(layout.own_rows)
        pad_source = 1 + rows * width + window  # the padding token's index in the flat source
        depths, slots, parents = layout.node_depths, layout.node_slots, layout.node_parents
        # Each node's index in the flat source: the root; a candidate of its parent's own row, or of
        # its depth's position row; past the candidate rows, the window's draft (slot 0 only).
        owner_row = owners[np.maximum(parents, 0)]
        source = np.where(depths < levels + 1, 1 + (depths - 1) * width + slots, 1 + rows * width + (depths - 1))
        source = np.where(owner_row >= 0, 1 + (levels + owner_row) * width + slots, source)
        source[0] = 0
        assert not np.any((depths > levels) & (owner_row < 0) & (slots > 0)), "a slot beyond 0 outside the candidate rows"
        counts = np.bincount(parents[1:], minlength=s)
        k = max(1, int(counts.max(initial=0)))
        child_source = np.full((s, k), pad_source, dtype=np.int64)
        child_source[parents[1:], slots[1:]] = source[1:]  # a node's children are its slots 0..k-1

        # a node's children were drawn from its depth's window q, or from its own row's
        q_rows = np.where(owners >= 0, window + owners, np.minimum(depths, max(window - 1, 0)))
        attend = layout.attend
        if pad:  # a budget's tree usually fills its pass: then its own mask is the pass's
            attend = torch.zeros(envelope, envelope, dtype=torch.bool)
            attend[:s, :s] = layout.attend
            attend.diagonal()[s:] = True  # padding sees only itself
        # the index tensors in one host -> device copy (a budget's pass builds them every pass)
        padded_depths, token_source, child_source, q_rows, single, multi, leaves = arrays_to_device(
            [np.concatenate([depths, np.zeros(pad, dtype=np.int64)]),
             np.concatenate([source, np.full(pad, pad_source)]), child_source, q_rows,
             np.flatnonzero(counts == 1), np.flatnonzero(counts > 1), np.flatnonzero(counts == 0)], device)
        return PassShape(
            layout=layout, envelope=envelope, levels=levels, depths=padded_depths,
            attend=copy_to_device(attend, device), token_source=token_source,
            child_source=child_source, q_rows=q_rows, single=single, multi=multi, leaves=leaves,
        )

    def children(self, flat_tokens: torch.Tensor, flat_valid: torch.Tensor) -> NodeChildren:
        """The children of every node with this pass's tokens and validity (two gathers)."""
        return NodeChildren(tokens=flat_tokens[self.child_source], valid=flat_valid[self.child_source],
                            q_rows=self.q_rows, single=self.single, multi=self.multi, leaves=self.leaves)


# A large pass shape holds an envelope x envelope mask (and its layout), and a run near the
# image's end meets a new one every pass: kept up to a number of bytes (on a GPU also a small
# share of its memory), the least recently used out.
@bounded_by_bytes(64 * MIB, device_fraction=0.01, weigh=lambda shape: field_tensor_bytes(shape) + layout_bytes(shape.layout))
def pass_shape(layout: TreeLayout, levels: int, width: int, window: int, envelope: int,
               device: torch.device) -> PassShape:
    """The PassShape of a layout, built once per process (a run uses a handful: chain and tree
    passes, and the shorter windows at the image's end). Keyed by the layout object, which
    `tree_layout` caches per shape: a layout made another way gets its own PassShape."""
    return PassShape.build(layout, levels, width, window, envelope, device)


@dataclass(frozen=True)
class PassPlan:
    """Stage 1's result: what the pass feeds and how its nodes relate to the draft."""

    shape: PassShape
    draft: Draft
    start: int  # n, committed tokens before the pass
    tokens: torch.Tensor  # long [E], the node tokens (padding included)
    children: NodeChildren  # the shape's children with this pass's tokens and validity


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
        self.budget = self.drafter.node_budget  # every pass padded to 1 + budget nodes, if set
        largest_window = config.window if isinstance(config.window, int) else max(self.candidates)
        if self.budget:  # the window caps the main chain the budget's tree may choose
            largest_window = min(config.window_size or self.budget, self.budget)
        self.largest_window = largest_window if config.method != "ar" else 0
        # the nodes of the largest pass beyond its root, and the most positions one pass touches
        self.pass_nodes = self.budget or self.largest_window + self.drafter.max_side_nodes
        span = (self.budget or largest_window + config.tree_depth) + 2
        self.rule = rules.make_rule(config.verify, seed, model.vocab_size, self.device,
                                    num_tokens=self.num_tokens, span=span)
        self.seed = seed
        # replaced after the prefill if "auto" (a budget's tree chooses its own window)
        self.window_policy = FixedWindow(self.largest_window if self.budget else config.window_size)
        self.auto_window = config.auto_window and not self.budget
        self.positions = torch.arange(self.num_tokens + span + self.pass_nodes + 2, device=self.device)
        # The committed tokens, filled pass by pass ([:num_committed] are final): the run's one buffer.
        self.committed = torch.zeros(self.num_tokens, dtype=torch.long, device=self.device)
        # A pass's flat token source ends in the padding token; its validity: True for the root
        # and the window, False for the padding (made once: a pass only reads them).
        self.padding_token = torch.zeros(1, dtype=torch.long, device=self.device)
        self.real = torch.ones(1, dtype=torch.bool, device=self.device)
        self.not_real = torch.zeros(1, dtype=torch.bool, device=self.device)
        self.ctx = DraftContext(self.rule, self.recipe, self.constraints, self.num_tokens,
                                config.init_proposal, self.positions, self.committed, constraints.row_length)
        self.timer = ForwardTimer(self.device)
        # An eager auto run chooses its tree too (a compiled one keeps its few pass shapes).
        self.adaptive_tree = (self.auto_window and not config.compile and config.use_pd
                              and config.tree.side_chain == 0)

    def _window_target(self, num_committed: int) -> int:
        return min(self.window_policy.next_window(), self.num_tokens - num_committed)

    # --- the run ----------------------------------------------------------------------------
    def run(self, prompts: List[torch.Tensor], callback: Optional[Callback]) -> SampleResult:
        stats = RunStats(num_tokens=self.num_tokens, method=self.config.method)
        session = self.model.open_session(prompts)
        try:
            # Size the cache once: the image, the largest pass and the auto window's probe.
            largest_pass = 1 + self.pass_nodes
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
        logits0 = processed_logits(logits.unsqueeze(1), pos0, self.recipe, self.constraints)
        p0 = torch.softmax(logits0, dim=-1)
        committed = self.committed
        committed[:1] = self.rule.target(p0, logits0, pos0)
        if self.auto_window and self.config.compile:
            self.window_policy = FixedWindow(AUTO_START_WINDOW)  # until the warm-up times the graphs
        elif self.config.node_budget == "auto":  # the budget drafter prices its passes on this hardware
            self.drafter.use_cost(measure_cost_curve(self.model, session, committed[0]))
        elif self.auto_window:
            cost = measure_cost_curve(self.model, session, committed[0])
            if self.adaptive_tree:
                self.window_policy = AutoTreeWindow(cost, narrower_trees(self.config.tree.widths),
                                                    candidates=self.candidates)
            else:
                self.window_policy = AutoWindow(cost, extra_nodes=self.config.tree_side_nodes,
                                                candidates=self.candidates)
        target = self._window_target(1)
        self.rule.prepare(1)
        draft = self.drafter.first(self.ctx, logits, 1, target)
        # The prefill's one sync (which also times it): whether p of the first token is finite.
        if fetch(dict(at=first_non_finite(p0, pos0)))["at"][0] >= 0:
            raise self._non_finite(0, p0, pos0, logits.unsqueeze(1))
        state = DecodeState(session=session, committed=committed, num_committed=1, draft=draft, target=target)
        self._record(state, stats, callback, start, syncs, committed=1, window=0, tree_nodes=0,
                     first_reject=-1, kept_by_ac=0, branch=(), envelope=0)
        return state

    def _iterate(self, state: DecodeState, stats: RunStats, callback: Optional[Callback]) -> None:
        start, syncs, moved = time.perf_counter(), SyncCounter.count, state.session.compaction_bytes
        with stage("plan"):
            plan = self._plan(state)
        with stage("forward"):
            logits = self._forward(state, plan)
        with stage("verify"):
            verdict = self._verify(state, plan, logits)
        with stage("sync"):
            decisions = verdict.decisions()  # the pass's one host sync
        if decisions.non_finite_at >= 0:
            raise self._non_finite(decisions.non_finite_at, verdict.p, verdict.positions, logits)
        window, layout = plan.draft.window, plan.shape.layout
        n = state.num_committed
        last_depth = self.num_tokens - n  # a node at this depth holds the image's last token
        with stage("commit"):
            outcome = walk(layout, decisions, last_depth)
            self._commit(state, plan, verdict, outcome)
        tree = plan.draft.tree
        self.window_policy.observe(outcome.accepted, censored=not outcome.rejected, window=len(window),
                                   tree_levels=plan.shape.levels, branch=outcome.branch,
                                   widths=tree.widths if tree is not None else ())
        if not state.done:
            with stage("draft"):
                target = self._window_target(state.num_committed)
                self.rule.prepare(state.num_committed)
                carried = continuation(layout, decisions, outcome, last_depth)
                report = PassReport(start=n, num_committed=state.num_committed, target=target, draft=plan.draft,
                                    node_tokens=plan.tokens[: layout.num_nodes],
                                    children=plan.children, outcome=outcome, decisions=decisions, verdict=verdict,
                                    proposal_logits=logits[:, carried.proposal],
                                    stale=StaleRows.gather(verdict, decisions, carried.nodes, self.device),
                                    tree_widths=self.window_policy.next_tree())
                state.draft, state.target = self.drafter.next(self.ctx, report), target
        self._record(state, stats, callback, start, syncs, committed=state.num_committed - n,
                     window=len(window), tree_nodes=layout.num_nodes - 1 - len(window),
                     first_reject=outcome.accepted if outcome.rejected else -1,
                     kept_by_ac=state.draft.kept_by_ac if not state.done else 0,
                     branch=outcome.branch[: plan.shape.levels],
                     envelope=plan.shape.envelope, compaction_bytes=state.session.compaction_bytes - moved)

    def _warm_up(self, state: DecodeState) -> float:
        """Compile the pass shapes this run will use (chain and tree passes of the window),
        outside the timed passes: each runs on the live cache and is rolled back. With
        window="auto" that is every candidate window, timed compiled for the auto window's cost
        curve."""
        start = time.perf_counter()
        side = self.drafter.max_side_nodes
        if self.auto_window:
            windows = self.candidates
        else:
            windows = (max(self.window_policy.next_window(), len(state.draft.window)),)
        sizes = sorted({1 + w + extra for w in windows for extra in {0, side}})
        if self.budget:  # every pass has the budget's size
            sizes = [1 + self.budget]
        for size in [s for s in sizes if not state.session.compiled_shape_ready(s)]:
            # two shapes for a fixed window (chain and tree passes); none on a repeat run
            tokens = state.committed[:1].expand(size).contiguous()
            eye = torch.eye(size, dtype=torch.bool, device=self.device)
            state.session.forward(tokens, torch.zeros_like(tokens), eye)
            state.session.keep([])  # the warm-up leaves the cache exactly as it was
        if self.auto_window:  # the graphs exist now: time them for the cost curve
            cost = measure_cost_curve(self.model, state.session, state.committed[0], sizes, compiled=True)
            self.window_policy = AutoWindow(cost, extra_nodes=side, candidates=self.candidates)
        synchronize(self.device)
        return time.perf_counter() - start

    def _envelope_window(self, drafts: int) -> int:
        """The window a pass of `drafts` drafts is padded to: itself, or on a compiled auto run
        the smallest candidate that holds it (a compiled graph exists only for those)."""
        if self.config.compile and self.auto_window:
            return min((w for w in self.candidates if w >= drafts), default=drafts)
        return drafts

    # --- the stages -------------------------------------------------------------------------
    def _plan(self, state: DecodeState) -> PassPlan:
        """Lay out the draft's tree as one batch padded to the pass's fixed envelope:
        1 + L for a chain pass, 1 + L + the drafter's largest tree for a tree pass."""
        draft = state.draft
        window, tree = draft.window, draft.tree
        levels, width = (tree.levels, tree.width) if tree is not None else (0, 1)
        if tree is None:
            side = 0
        elif self.adaptive_tree:  # its shapes vary anyway: pad only to the chosen tree
            side = tree.layout.num_nodes - 1 - len(window)
        else:
            side = self.drafter.max_side_nodes
        # The policy's window, not the positions left: the shape stays fixed up to the image's end.
        envelope = 1 + self._envelope_window(max(self.window_policy.next_window(), len(window))) + side
        if draft.nodes:  # a budget drafter pads every pass to its budget
            envelope = 1 + draft.nodes
        if draft.nodes and tree is not None:
            # A budget's tree is new nearly every pass (it follows the acceptance counts): hashing
            # and weighing it for the cache took longer than building it.
            shape = PassShape.build(draft.layout, levels, width, len(window), envelope, self.device)
        else:
            shape = pass_shape(draft.layout, levels, width, len(window), envelope, self.device)
        root, pad, real = state.root_token, self.padding_token, self.real
        if tree is not None:
            flat = torch.cat([root, tree.candidates.reshape(-1), window.tokens, pad])
            valid = torch.cat([real, tree.valid.reshape(-1), real.expand(len(window)), self.not_real])
        else:
            flat = torch.cat([root, window.tokens, pad])
            valid = torch.cat([real.expand(1 + len(window)), self.not_real])
        return PassPlan(shape=shape, draft=draft, start=state.num_committed,
                        tokens=flat.index_select(0, shape.token_source), children=shape.children(flat, valid))

    def _forward(self, state: DecodeState, plan: PassPlan) -> torch.Tensor:
        """One model pass; node at depth d predicts image position n + d. Logits [B, E, V]."""
        self.timer.start()
        logits = state.session.forward(plan.tokens, plan.shape.depths, plan.shape.attend)
        self.timer.stop()
        return logits

    def _verify(self, state: DecodeState, plan: PassPlan, logits: torch.Tensor) -> Verdict:
        """Every decision of the pass, on the device, per tree node: which child is accepted,
        the token after the node if the walk ends there, and the verdict's draw for drafting."""
        n, last = plan.start, self.num_tokens - 1
        s = plan.shape.layout.num_nodes
        self.rule.prepare(n)
        positions = (n + plan.shape.depths[:s]).clamp(max=last)
        processed = processed_logits(logits[:, :s], positions, self.recipe, self.constraints)
        probs = torch.softmax(processed, dim=-1)
        children = plan.children
        accepted, next_token = self.rule.verify(probs, positions, children, plan.draft, processed)
        draft_token = self.rule.continued(children, accepted, next_token)
        return Verdict(accepted_child=accepted, next_token=next_token, draft_token=draft_token, p=probs,
                       positions=positions, non_finite_at=first_non_finite(probs, positions))

    def _non_finite(self, position: int, p: torch.Tensor, positions: torch.Tensor,
                    logits: torch.Tensor) -> NonFiniteError:
        """The run's end at a row of p that is not finite (logits [B, S, V] of the rows of p)."""
        row = non_finite_row(p, positions, position)
        allowed = self.constraints.mask(positions[row : row + 1])[0]
        return non_finite_error(position, self.num_tokens, logits[:, row], allowed, self.recipe)

    def _commit(self, state: DecodeState, plan: PassPlan, verdict: Verdict, outcome: PassOutcome) -> None:
        """Commit the path and the final token; keep only the path's cache entries."""
        n, a = plan.start, outcome.accepted
        if a:
            path = to_device(outcome.path_nodes, self.device)
            state.committed[n : n + a] = plan.tokens.index_select(0, path)
        new_n = n + a
        if outcome.final is not None:
            state.committed[new_n : new_n + 1] = verdict.next_token[outcome.final : outcome.final + 1]
            new_n += 1
        state.session.keep([0, *outcome.path_nodes])
        state.num_committed = new_n

    def _record(self, state: DecodeState, stats: RunStats, callback: Optional[Callback], start: float,
                syncs: int, **fields) -> None:
        record = PassRecord(index=len(stats.records), total_committed=state.num_committed,
                            wall_time=time.perf_counter() - start, forward_time=self.timer.seconds(),
                            host_syncs=SyncCounter.count - syncs, **fields)
        stats.records.append(record)
        if record.envelope:  # not the prefill
            self.window_policy.note_overhead(record.wall_time - record.forward_time)
            self.drafter.note_overhead(record.wall_time - record.forward_time)
        if callback is not None:
            callback(Progress(record, stats, state.committed[: state.num_committed], state.num_tokens))

"""Budget-aware drafting: the best tree of B nodes from the acceptance this run has seen.

A node is a row of a pass beyond its root (with classifier-free guidance each node is two rows
of the forward; budgets count nodes). A pass of B nodes may spend them on a long main chain, on
candidates beside its drafts, or on branches behind those candidates. What each is worth follows
from counts kept over the run's passes so far:

* how often candidate slot s of a window position wins (slot 0 is the draft, slots 1.. the other
  candidates of its draw, one draw without replacement from the position's q), kept as survival
  counts per slot (`AcceptanceTable`): P(slot s wins | slots < s lost);
* by the position's *class* (`position_classes`): its distance from the window's start (the
  pass's root is a changed token: the drafts right behind it were drafted in another context
  and fail most), the first position after a pass that ended on a side leaf (its bonus token came
  from an exact p, so the change is two positions back), and positions new to the window
  (drafted from the nearest stale logits). Behind a path that took another candidate than the
  draft, the distance counts from that candidate (`after_deviation`). With own rows
  (side_rows.py), the positions behind a side candidate at the first position are classes of
  their own (`OWN_ROW`, by how far behind it): their drafts come from other proposals.

A node lies on the accepted path with the product of its slots' win probabilities along its path
(the first accepted candidate in draw order wins). The tree holds the nodes of largest gain, as in
EAGLE-2's tree construction; a node's gain is

* its chance to be accepted (the expected accepted drafts of a tree are the sum of its nodes'),
* plus, for a side node, `leaf_value` times that chance: a pass that ends on a side leaf commits
  that leaf's bonus token, so the next pass starts two positions after the change instead of
  one; `leaf_value` is the measured difference in accepted drafts between passes that started
  the two ways (less the parent's, where a side leaf gets its first child and stops being one);
* plus a refresh value for the next pass: every main-chain node computes the p that drafts the
  position after it next time (a window shorter than the chain it could have carried leaves
  the next pass drafts from stale logits), and a candidate beside the main chain catches the
  draft Adaptive Continuation redraws there, so the next draft after it is continued from a p
  whose context holds the new token (`REFRESH_VALUE` x its chance to be reached from the main
  chain), both decaying with the position (`REFRESH_DECAY`: far positions are drafted again).
  The main chain is at least `CHAIN_PASSES` times the tokens a pass commits (measured): a draft
  is refined over several passes before it reaches the front.

A candidate slot joins only after the one before it, and the measured win probabilities need not
fall with the slot (right behind a change, the second candidate wins less often than the third
and fourth). So a side candidate is valued by the best run of candidates it opens: the best mean
gain per node of slots s..s+k-1 together (`run_means`), as the concave hull of a separable
allocation; a weak slot then joins when the run behind it is worth its nodes, and the strong
slots after it follow at once. Near the budget's end a run counts only the nodes still free.

Two ways to choose the tree from these gains: `ranked_tree` values every node of a fixed superset
(the main chain, candidates beside it, short branches below them) in a few array operations and
keeps the best; `greedy_tree` adds nodes one at a time from a heap and reaches any shape (own
rows too), at a few hundred host steps per pass. The drafter uses the first under the gumbel
rule, where on the demo's held-out prompts it also commits more tokens per pass, and the second
under rejection, where its deeper branches commit more (docs/benchmark.md).

The counts come from passes already verified and the tree is chosen before its pass; the classes
depend only on the committed tokens' passes (never on a draft's value), so no choice sees the
pass's own p or outcome, or a later draft: the sampler stays exact (drafters.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..sampling.tree import TreeLayout, TreeShape, build_layout, layout_of_nodes
from .side_rows import own_row_level

Path = Tuple[int, ...]

MAX_SLOTS = 32  # candidates one position may get
MAX_DISTANCE = 24  # distances from the window's start are told apart up to this; further ones pool
NEW = MAX_DISTANCE + 1  # the class of a position new to the window
LEAF_START = NEW + 1  # the first position after a pass that ended on a side leaf (its bonus token)
# Positions behind a side candidate at the window's first position, drafted from its own
# proposals (side_rows.py): by how far behind it, the last pooling the rest.
OWN_ROW = LEAF_START + 1
OWN_ROW_LEVELS = 3
CLASSES = OWN_ROW + OWN_ROW_LEVELS
CHAIN_VALUE = 0.1  # the refresh value of a main-chain node at position 0, in accepted drafts
REFRESH_VALUE = 0.5  # that of a candidate beside the main chain, times its chance to be reached
REFRESH_DECAY = 0.97  # per position
# The main chain is at least this many times the tokens a pass commits (measured): a draft is
# refined over several passes before it reaches the window's front.
CHAIN_PASSES = 8.0
# The budgets node_budget="auto" chooses among (a pass is padded to its budget).
BUDGET_CHOICES: Tuple[int, ...] = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # up to config.MAX_AUTO_BUDGET
# The first children below a side candidate that `ranked_tree` values (counted on the demo's
# held-out prompts: 2 levels beat 0 and 3 within 32-256 nodes).
BRANCH_DEPTH = 2


def position_classes(carried: int, window: int, after_leaf: bool) -> Tuple[int, ...]:
    """The class of each of `window` positions: its distance from the last changed token (the
    root, one position before the window; two after a pass that ended on a side leaf, whose
    bonus token followed the leaf), capped at MAX_DISTANCE; LEAF_START for the first position
    after such a pass; NEW past the `carried` drafts the last pass verified."""
    change = -2 if after_leaf else -1
    carried = max(0, min(carried, window))
    counted = min(carried, max(0, MAX_DISTANCE + change))  # the positions nearer than MAX_DISTANCE
    classes = [*range(-change, counted - change)] + [MAX_DISTANCE] * (carried - counted)  # whole runs, no loop
    if after_leaf and carried:
        classes[0] = LEAF_START
    return tuple(classes) + (NEW,) * (window - carried)


def chain_floor(tokens_per_pass: float, budget: int) -> int:
    """The main chain's least length: CHAIN_PASSES times the tokens a pass commits, at most
    three quarters of the budget (the rest goes to candidates)."""
    return min(int(CHAIN_PASSES * tokens_per_pass), 3 * budget // 4)


def after_deviation(cls: int, distance: int) -> int:
    """A position's class behind a path that took another candidate than the draft `distance`
    positions earlier (the position's q saw the draft there)."""
    return cls if cls == NEW else min(cls, distance)


class AcceptanceTable:
    """Decayed survival counts of the winning candidate slot, per position class.

    at_risk[c, s]: positions of class c where slot s was tried (every slot before it lost);
    wins[c, s]: those where slot s won. A position whose k candidates all lost says only "slot
    >= k" (censored). A cell borrows `PRIOR_WEIGHT` passes of the slot's hazard pooled over the
    classes, which borrows as many of `PRIOR_HAZARD`: optimistic, so that a slot no pass has
    tried yet gets tried.
    """

    PRIOR_WEIGHT = 2.0
    PRIOR_HAZARD = 0.5

    def __init__(self, slots: int = MAX_SLOTS, decay: float = 0.98) -> None:
        self.slots = slots
        self.decay = decay
        self.at_risk = np.zeros((CLASSES, slots))
        self.wins = np.zeros((CLASSES, slots))
        # the same counts over the whole run, never decayed (what a benchmark reports)
        self.seen_at_risk = np.zeros((CLASSES, slots))
        self.seen_wins = np.zeros((CLASSES, slots))

    def age(self) -> None:
        self.at_risk *= self.decay
        self.wins *= self.decay

    def add(self, cls: int, width: int, slot: int) -> None:
        """One position of class `cls` with `width` candidates; `slot` won (-1: none did)."""
        width = min(width, self.slots)
        tried = width if slot < 0 else min(slot + 1, width)
        self.at_risk[cls, :tried] += 1.0
        self.seen_at_risk[cls, :tried] += 1.0
        if 0 <= slot < width:
            self.wins[cls, slot] += 1.0
            self.seen_wins[cls, slot] += 1.0

    def hazards(self) -> np.ndarray:
        """[CLASSES, slots]: P(slot s wins | slots < s lost), shrunk towards the pooled slot."""
        pooled = (self.wins.sum(0) + self.PRIOR_WEIGHT * self.PRIOR_HAZARD) / (self.at_risk.sum(0) + self.PRIOR_WEIGHT)
        return (self.wins + self.PRIOR_WEIGHT * pooled) / (self.at_risk + self.PRIOR_WEIGHT)

    def win_probabilities(self) -> np.ndarray:
        """[CLASSES, slots]: P(slot s wins) = hazard(s) x P(slots < s all lose)."""
        hazard = self.hazards()
        survive = np.cumprod(1.0 - hazard, axis=1)
        before = np.concatenate([np.ones((CLASSES, 1)), survive[:, :-1]], axis=1)
        return hazard * before


class DecayedMean:
    """A decayed running mean (recent passes weigh more), starting from `prior`."""

    def __init__(self, prior: float, decay: float = 0.98) -> None:
        self.weight, self.total, self.decay = 1.0, prior, decay

    def add(self, value: float) -> None:
        self.weight = self.weight * self.decay + 1.0
        self.total = self.total * self.decay + value

    @property
    def mean(self) -> float:
        return self.total / self.weight


@dataclass(frozen=True, eq=False)
class BudgetTree:
    """The chosen tree: its nodes laid out in the order they were added (every prefix a valid
    tree), the main chain's length (the window the pass feeds), candidates per window position
    (its position rows), the nodes that own a proposal with their children's count (`own_rows`,
    `own_widths`), and the expected accepted drafts after each node was added (`expected[k -
    1]`: the tree of its first k nodes)."""

    layout: TreeLayout
    window: int
    widths: Tuple[int, ...]
    expected: Tuple[float, ...]
    own_rows: Tuple[Path, ...] = ()
    own_widths: Tuple[int, ...] = ()

    @property
    def paths(self) -> Tuple[Path, ...]:
        """The nodes as slot paths (root excluded), in the order they were added."""
        return self.layout.shape.paths

    @property
    def num_nodes(self) -> int:
        """The nodes beyond the root."""
        return self.layout.num_nodes - 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BudgetTree):
            return NotImplemented
        return ((self.paths, self.window, self.widths, self.expected, self.own_rows, self.own_widths)
                == (other.paths, other.window, other.widths, other.expected, other.own_rows, other.own_widths))

    __hash__ = None  # compared by value, never a key

    @staticmethod
    def of(paths: Sequence[Path], expected: Sequence[float], own_rows: bool) -> "BudgetTree":
        """The tree of `paths`: its main chain, and the width of every row its nodes are drawn
        from (a node's parent owns a row, with `own_rows`, else its position's)."""
        window = max((len(p) for p in paths if not any(p)), default=0)
        widths = [0] * window
        owners: dict = {}  # parent path -> its children's count, in the order the parents appear
        for p in paths:
            parent = p[:-1]
            if own_rows and own_row_level(parent) >= 0:
                owners[parent] = max(owners.get(parent, 0), p[-1] + 1)
            else:
                widths[len(p) - 1] = max(widths[len(p) - 1], p[-1] + 1)
        layout = build_layout(TreeShape(tuple(paths), tuple(owners)))
        return BudgetTree(layout, window, tuple(widths), tuple(expected), tuple(owners), tuple(owners.values()))

    @staticmethod
    def of_nodes(parents: np.ndarray, slots: np.ndarray, expected: Sequence[float]) -> "BudgetTree":
        """The tree of nodes given as arrays, root first (no node owns a proposal), in whole-array
        steps: its main chain and the candidates of each window position."""
        layout = layout_of_nodes(parents, slots)
        window = len(layout.main_nodes) - 1
        widths = np.zeros(window, dtype=np.int64)
        np.maximum.at(widths, layout.node_depths[1:] - 1, layout.node_slots[1:] + 1)
        return BudgetTree(layout, window, tuple(widths.tolist()), tuple(expected))

    def first(self, nodes: int) -> "BudgetTree":
        """The tree of the first `nodes` nodes added."""
        if self.own_rows:
            return BudgetTree.of(self.paths[:nodes], self.expected[:nodes], own_rows=True)
        kept = slice(0, nodes + 1)  # the root and the first `nodes` added
        return BudgetTree.of_nodes(self.layout.node_parents[kept], self.layout.node_slots[kept],
                                   self.expected[:nodes])


def run_means(win: np.ndarray, width_cap: int) -> np.ndarray:
    """[classes, slots, slots]: out[c, s, k - 1] = the mean of win[c, s : s + k], the gain per
    node of candidate slots s..s+k-1 added together (-inf where the run passes `width_cap`)."""
    classes, slots = win.shape
    cap = min(width_cap, slots)
    ends = np.concatenate([np.zeros((classes, 1)), np.cumsum(win[:, :cap], axis=1)], axis=1)  # [c, cap + 1]
    start = np.arange(slots)[:, None]
    length = np.arange(1, slots + 1)[None, :]
    end = start + length
    fits = end <= cap
    sums = ends[:, np.minimum(end, cap)] - ends[:, np.minimum(start, cap)]
    return np.where(fits[None], sums / length[None], -np.inf)


def path_class(classes: Sequence[int], path: Path, deviation: int, own_rows: bool) -> int:
    """The class of the window position of the node at `path`, whose parent's path last took
    another candidate than the draft at position `deviation` (-1: never): with `own_rows`, an
    own-row class behind a side candidate at the first position (its parent owns a proposal)."""
    pos = len(path) - 1
    level = own_row_level(path[:-1]) if own_rows else -1
    if level >= 0:
        return OWN_ROW + min(level, OWN_ROW_LEVELS - 1)
    return classes[pos] if deviation < 0 else after_deviation(classes[pos], pos - deviation)


def greedy_tree(win: np.ndarray, classes: Sequence[int], budget: int, max_width: int, leaf_value: float = 0.0,
                chain_value: float = CHAIN_VALUE, refresh_value: float = REFRESH_VALUE,
                refresh_decay: float = REFRESH_DECAY, min_chain: int = 0, own_rows: bool = False) -> BudgetTree:
    """The tree of at most `budget` nodes with the largest gain (the module docstring), the main
    chain's first `min_chain` nodes first, added node by node: any shape, own rows included.
    The drafter uses `ranked_tree` (the same gains in array operations) under the gumbel rule.

    win: [CLASSES, slots] win probabilities (AcceptanceTable.win_probabilities); classes: the
    class of each window position there is a draft for. A node joins only after its parent, its
    next-lower slot and the main chain's node at its position (the main branch is the window),
    so every prefix of the order nodes join in is a valid tree.
    """
    window = len(classes)
    width_cap = max(1, min(max_width, win.shape[1]))
    runs = run_means(win, width_cap)
    # The heap's few hundred entries read host floats (a numpy scalar per read costs ~10x more):
    # the table as lists, and each slot's best run while the whole run fits the nodes left
    # (`free` >= the slots up to the cap; nearer the budget's end the run is looked up again).
    win_rows = win.tolist()
    best_run = runs.argmax(axis=2)  # [classes, slots]: the first longest-mean run, less one
    best_runs = (best_run + 1).tolist()
    best_means = np.take_along_axis(runs, best_run[..., None], axis=2)[..., 0].tolist()

    # A frontier entry: (-gain, path, parent's node index, parent's last deviation (-1: none),
    # parent's chance, parent's reach, node's chance, node's reach, nodes of the run its gain
    # counts, the nodes free then). Paths are unique, so the fields after it never order entries.
    # Reach: the chance that the next pass's drafts are continued through the node (1 on the main
    # chain; from the main chain on, for a side node). A candidate slot > 0's gain is its best
    # run's mean gain per node (every term of it is linear in the slot's win probability).
    def entry(path: Path, parent: int, parent_dev: int, parent_chance: float, parent_reach: float, free: int) -> tuple:
        pos, slot = len(path) - 1, path[-1]
        cls = path_class(classes, path, parent_dev, own_rows)
        p_win = win_rows[cls][slot]
        chance = parent_chance * p_win
        decay = refresh_decay ** pos
        run = 1
        if parent_dev < 0 and slot == 0:  # the main chain
            reach = 1.0
            gain = chance + chain_value * decay + (2.0 if pos < min_chain else 0.0)  # the floor first
        else:
            reach = parent_reach * p_win
            per_win = (1.0 + leaf_value) * parent_chance + refresh_value * decay * parent_reach
            if slot == 0:  # the first child of a side leaf, which stops being one
                gain = per_win * p_win - leaf_value * parent_chance
            elif free >= width_cap - slot:  # every run from this slot fits
                run = best_runs[cls][slot]
                gain = per_win * best_means[cls][slot]
            else:
                means = runs[cls, slot, :max(1, free)]
                run = int(np.argmax(means)) + 1
                gain = per_win * float(means[run - 1])
        return (-gain, path, parent, parent_dev, parent_chance, parent_reach, chance, reach, run, free)

    chosen: List[Path] = []
    parents: List[int] = [-1]  # the chosen nodes' parents and slots, the root first
    slots: List[int] = [0]
    expected: List[float] = []
    main = 0  # positions the main chain covers
    waiting: list = []  # side nodes past the main chain's end, until it gets there
    heap = [entry((0,), 0, -1, 1.0, 1.0, budget)] if window and budget > 0 else []
    total = 0.0
    revalued = 0  # entries valued again since the last node was chosen
    while heap and len(chosen) < budget and heap[0][0] < 0:  # about `budget` pops: a few hundred host steps
        _, path, parent, parent_dev, parent_chance, parent_reach, chance, reach, run, _ = heapq.heappop(heap)
        free_now = budget - len(chosen)
        if run > free_now:  # its run no longer fits: valued again on the nodes still free
            # Valued on the nodes still free, an entry fits, so each is valued again at most once
            # between two choices; more re-valuations than entries means one never fits, and
            # the loop would never end (a run counted one node over the free nodes, say).
            revalued += 1
            if revalued > len(heap) + 1:
                raise RuntimeError(f"internal error in greedy_tree: node {path}'s run of {run} nodes never fits the "
                                   f"{free_now} nodes left of a budget of {budget}")
            heapq.heappush(heap, entry(path, parent, parent_dev, parent_chance, parent_reach, free_now))
            continue
        revalued = 0
        pos, slot = len(path) - 1, path[-1]
        chosen.append(path)
        parents.append(parent)
        slots.append(slot)
        node = len(chosen)
        total += chance
        expected.append(total)
        deviation = pos if slot > 0 else parent_dev
        if deviation < 0:  # a main-chain node: side nodes waiting for this position come in
            main = pos + 1
            ready = [w for w in waiting if len(w[1]) <= main]
            waiting = [w for w in waiting if len(w[1]) > main]
            for item in ready:
                heapq.heappush(heap, item)
        free_now -= 1
        if slot + 1 < width_cap:  # the next candidate beside this node
            heapq.heappush(heap, entry(path[:-1] + (slot + 1,), parent, parent_dev, parent_chance, parent_reach,
                                       free_now))
        if pos + 1 < window:  # the node's first child
            child = entry(path + (0,), node, deviation, chance, reach, free_now)
            if deviation < 0 or pos + 1 < main:
                heapq.heappush(heap, child)
            else:
                waiting.append(child)
    if own_rows:  # which nodes own a row follows from their paths
        return BudgetTree.of(chosen, expected, own_rows)
    return BudgetTree.of_nodes(np.asarray(parents), np.asarray(slots), expected)


def ranked_tree(win: np.ndarray, classes: Sequence[int], budget: int, max_width: int, leaf_value: float = 0.0,
                chain_value: float = CHAIN_VALUE, refresh_value: float = REFRESH_VALUE,
                refresh_decay: float = REFRESH_DECAY, min_chain: int = 0,
                branch_depth: int = BRANCH_DEPTH) -> BudgetTree:
    """The tree of at most `budget` nodes by the gains `greedy_tree` adds them by, chosen in a few array
    operations instead of node by node: every node of a fixed superset is valued at once and
    the `budget` best are kept, as EAGLE-2 reranks its draft tree.

    The superset: the main chain (one node per window position), candidates 1.. beside every
    main-chain node, and below each candidate the chain of its first children `branch_depth`
    deep (what the greedy takes, after its first passes; a candidate beside a branch node is
    left out). A node's value is the least gain on its way in: its own and that of every node
    it needs first (its parent, the slot before it, the main chain's node at its position).
    Ranked by value, prerequisites first on ties, every prefix of the ranking is a valid tree,
    and the ranking is the order the greedy adds the same nodes in while every run of slots
    still fits the nodes left (near the budget's end the greedy prices runs by the nodes left).
    """
    window = len(classes)
    width = max(1, min(max_width, win.shape[1]))
    if not window or budget <= 0:
        return BudgetTree.of((), (), own_rows=False)
    cls = np.asarray(classes)
    decay = refresh_decay ** np.arange(window)
    # 1. The main chain: node j holds position j's draft; its parent is node j - 1 (the root).
    chance = np.cumprod(win[cls, 0])
    parent_chance = np.concatenate([np.ones(1), chance[:-1]])
    main_gain = chance + chain_value * decay + 2.0 * (np.arange(window) < min_chain)  # the floor first
    main_value = np.minimum.accumulate(main_gain)
    # 2. Candidates 1.. at position j (siblings of main node j), each valued by the best run of
    #    slots it opens, as in greedy_tree: [window, width - 1].
    best_run = run_means(win, width).max(axis=2)[cls, 1:width]
    per_win = (1.0 + leaf_value) * parent_chance + refresh_value * decay
    side_value = np.minimum.accumulate(np.concatenate([main_value[:, None], per_win[:, None] * best_run], 1),
                                       axis=1)[:, 1:]
    side_win = win[cls, 1:width]
    values, chances = [main_value, side_value.ravel()], [chance, (parent_chance[:, None] * side_win).ravel()]
    # 3. Branches: the first child e levels below candidate (j, s), at position j + e, whose
    #    class counts its distance from the candidate (after_deviation): [window - e, width - 1].
    above_chance, above_reach, above_value = parent_chance[:, None] * side_win, side_win, side_value
    for e in range(1, min(branch_depth, window - 1) + 1):
        at = cls[e:]
        p = win[np.where(at == NEW, NEW, np.minimum(at, e)), 0][:, None]
        above_chance, above_reach, above_value = above_chance[:-1], above_reach[:-1], above_value[:-1]
        per_win = (1.0 + leaf_value) * above_chance + refresh_value * decay[e:, None] * above_reach
        gain = per_win * p - leaf_value * above_chance  # a side leaf's first child: the leaf stops being one
        above_value = np.minimum(np.minimum(gain, above_value), main_value[e:, None])
        above_chance, above_reach = above_chance * p, above_reach * p
        values.append(above_value.ravel())
        chances.append(above_chance.ravel())
    value = np.concatenate(values)
    order = top_ranked(value, budget)
    order = order[value[order] > 0]
    parents, slots = superset_nodes(order, window, width - 1, value.size)
    return BudgetTree.of_nodes(parents, slots, tuple(np.cumsum(np.concatenate(chances)[order]).tolist()))


def top_ranked(value: np.ndarray, count: int) -> np.ndarray:
    """The indices of the `count` largest values, largest first, the lower index first on ties
    (a stable sort by -value, cut to `count`): the few above the count-th value and the lowest
    indices at it are picked by a partition, then only they are sorted (the superset holds
    thousands of nodes, a pass keeps a few hundred)."""
    if count >= value.size:
        return np.lexsort((np.arange(value.size), -value))
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    threshold = np.partition(value, value.size - count)[value.size - count]  # the count-th largest
    above = np.flatnonzero(value > threshold)
    at = np.flatnonzero(value == threshold)[: count - above.size]  # the lowest indices at the threshold
    picked = np.concatenate([above, at])
    return picked[np.lexsort((picked, -value[picked]))]


def superset_nodes(nodes: np.ndarray, window: int, sides: int, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """The parents and slots (root first, then the chosen `nodes` in their order) of nodes of
    `ranked_tree`'s superset of `size` nodes, by index: the main chain's `window` (position j:
    slot 0 below position j - 1's), then `sides` candidates per position (position j, slot s:
    below position j - 1's main-chain node), then each branch level e's (window - e) x sides
    (slot 0 below the same candidate's node at level e - 1). A parent comes before its child."""
    nodes = np.asarray(nodes, dtype=np.int64)
    starts = [0, window]  # where each block starts: the main chain, side level 0, branch levels 1, 2, ...
    while starts[-1] < size:
        starts.append(starts[-1] + (window - (len(starts) - 2)) * sides)
    starts = np.asarray(starts[:-1], dtype=np.int64)
    block = np.searchsorted(starts, nodes, side="right") - 1  # 0: main chain, 1 + e: side level e
    local = nodes - starts[block]
    main, level = block == 0, block - 1
    # the parent's superset index (-1: the root): a main-chain node's and a level-0 candidate's is
    # the main chain one position up; a branch node's, the same candidate's node one level up
    parent_index = np.where(main, local - 1, np.where(level == 0, local // max(sides, 1) - 1,
                                                       starts[np.maximum(block - 1, 0)] + local))
    node_of = np.full(size, -1, dtype=np.int64)
    node_of[nodes] = np.arange(1, nodes.shape[0] + 1)
    parents = np.where(parent_index < 0, 0, node_of[np.maximum(parent_index, 0)])
    if np.any(parents < 0) or np.any(parents > np.arange(nodes.shape[0])):
        raise RuntimeError("internal error in ranked_tree: a node comes before its parent")
    slots = np.where(level == 0, local % max(sides, 1) + 1, 0)
    return (np.concatenate([np.full(1, -1, dtype=np.int64), parents]),
            np.concatenate([np.zeros(1, dtype=np.int64), slots]))


def fastest_budget(expected: Sequence[float], pass_seconds: Callable[[int], float],
                   choices: Sequence[int] = BUDGET_CHOICES) -> Optional[int]:
    """The budget in `choices` with the most expected tokens per second: (1 + expected
    accepted drafts of the tree's first B nodes) / the seconds of a pass of 1 + B nodes. A
    larger budget must beat the best smaller one by 1%: the estimate is never exact."""
    best, best_speed = None, 0.0
    for budget in sorted(choices):
        if budget > len(expected):
            break
        speed = (1.0 + expected[budget - 1]) / pass_seconds(1 + budget)
        if best is None or speed > best_speed * 1.01:
            best, best_speed = budget, speed
    return best

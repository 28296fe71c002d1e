"""The run's neighbour laws (engine/neighbour_laws.py) on hand-made passes."""

import torch

from sjd_pac_core.engine.neighbour_laws import FLOOR, DenseRows, NeighbourLaws, TopRows, make_laws
from sjd_pac_core.models import memory
from sjd_pac_core.models.memory import law_row_entries, law_table_bytes

V, ROW = 4, 3  # 4 tokens; a grid row of 3 positions
ALL = torch.ones(V, dtype=torch.bool)


def laws_after(tokens, positions, p, committed, num_committed, row_length=ROW):
    laws = NeighbourLaws(V, row_length, torch.device("cpu"))
    laws.add(torch.tensor(tokens), torch.tensor(positions), torch.tensor(p), torch.as_tensor(committed), num_committed)
    return laws


def test_the_law_behind_a_token_is_the_average_p_computed_behind_it():
    # two nodes holding token 2 computed p for positions 1 and 2 (no token above either: row 0)
    laws = laws_after([2, 2], [1, 2], [[0.5, 0.5, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0]], [0, 2, 0, 0, 0, 0], 2)
    q, seen = laws.law(2, torch.tensor([0, 2, 0, 0, 0, 0]), ALL)  # token 2 to the left, nothing above
    assert bool(seen)
    expected = torch.tensor([0.25, 0.5, 0.25, 0.0]).clamp(min=FLOOR)
    assert torch.allclose(q, expected / expected.sum())


def test_with_a_token_above_the_law_is_the_normalised_geometric_mean_of_both():
    committed = [1, 3, 0, 1, 0, 0]
    # node holding token 1 computed p for position 4: left law of token 1; above position 1: token 3
    laws = laws_after([1], [4], [[0.1, 0.4, 0.4, 0.1]], committed, 4)
    # the above law of token 3 is that same p; left of position 4 is token 1 (committed[3])
    q, seen = laws.law(4, torch.tensor(committed), ALL)
    assert bool(seen) and torch.allclose(q, torch.tensor([0.1, 0.4, 0.4, 0.1]))
    left = torch.tensor([0.5, 0.5, 0.0, 0.0])
    laws.add(torch.tensor([1]), torch.tensor([1]), left.unsqueeze(0), torch.tensor(committed), 4)  # no token above
    q, _ = laws.law(4, torch.tensor(committed), ALL)
    left_law = (torch.tensor([0.1, 0.4, 0.4, 0.1]) + left) / 2
    product = (left_law.clamp(min=FLOOR) * torch.tensor([0.1, 0.4, 0.4, 0.1])).sqrt()
    assert torch.allclose(q, product / product.sum())


def test_only_final_tokens_above_and_positions_inside_the_image_count():
    committed = torch.tensor([1, 3, 0, 1, 0, 0])
    # position 5's token above is position 2, not yet final (2 committed); position 9 is past the end
    laws = laws_after([1, 1], [5, 9], [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], committed, 2)
    assert float(laws.above_count[:V].sum()) == 0.0  # (row V: what does not count, never read)
    assert torch.equal(laws.left_count[:V], torch.tensor([0.0, 1.0, 0.0, 0.0]))  # the p for position 9 is not kept
    assert torch.allclose(laws.sums.read(torch.tensor([1]))[0], torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_the_law_keeps_to_the_allowed_tokens_and_knows_when_it_has_seen_nothing():
    laws = laws_after([2], [1], [[0.7, 0.1, 0.1, 0.1]], [0, 2, 0], 2, row_length=0)
    allowed = torch.tensor([False, True, True, True])
    q, seen = laws.law(2, torch.tensor([0, 2, 0]), allowed)
    assert bool(seen) and q[0] == 0 and torch.allclose(q[1:], torch.full((3,), 1 / 3))
    _, seen = laws.law(1, torch.tensor([0, 2, 0]), allowed)  # token 0 to the left: never seen
    assert not bool(seen)


def test_the_window_law_reads_each_positions_neighbours_from_the_committed_tokens_and_the_drafts():
    # row 3: positions 3, 4, 5 lie below 0, 1, 2; 4 committed, the window starts at position 4
    committed = torch.tensor([0, 1, 2, 3, 0, 0, 0, 0])
    behind = {0: [1.0, 0.0, 0.0, 0.0], 1: [0.0, 1.0, 0.0, 0.0], 2: [0.0, 0.0, 1.0, 0.0], 3: [0.0, 0.0, 0.0, 1.0]}
    laws = NeighbourLaws(V, ROW, torch.device("cpu"))
    # one node per token, each alone in its own pass: token t's left law is the one-hot behind[t]
    for token, p in behind.items():
        laws.add(torch.tensor([token]), torch.tensor([1]), torch.tensor([p]), committed, 1)
    drafts = torch.tensor([2, 0, 1, 3, 3])  # the window's drafts for positions 4..8
    q, seen = laws.window_law(4, drafts, committed, torch.ones(4, V, dtype=torch.bool))
    assert bool(seen.all())
    # left of 4: committed 3; left of 5, 6, 7: the drafts 2, 0, 1 (no above law was learned)
    assert torch.equal(q.argmax(-1), torch.tensor([3, 2, 0, 1]))
    # an above law for token 1 (the token above position 4) pulls position 4 towards it
    laws.add(torch.tensor([3]), torch.tensor([4]), torch.tensor([[0.0, 0.5, 0.0, 0.5]]), committed, 4)
    q, _ = laws.window_law(4, drafts, committed, torch.ones(4, V, dtype=torch.bool))
    assert float(q[0, 1]) > 0.2 and float(q[0, 0]) < 1e-3
    # position 7 lies below position 4, whose token is a draft (2). A node holding token 1 at
    # position 4 computed [0, 0, 0, 1] for position 5 (below committed token 2): token 1's left law
    # becomes [0, .5, 0, .5], token 2's above law [0, 0, 0, 1]; read from the draft above, the
    # latter settles position 7 on token 3 (alone, the left law would leave it at one half)
    assert int(q[3].argmax()) == 1
    laws.add(torch.tensor([1]), torch.tensor([5]), torch.tensor([[0.0, 0.0, 0.0, 1.0]]), committed, 4)
    q, _ = laws.window_law(4, drafts, committed, torch.ones(4, V, dtype=torch.bool))
    assert float(q[3, 3]) > 0.99


def test_near_the_images_top_a_position_with_no_row_above_has_only_its_left_law():
    # row 3; the window starts at position 2, whose token above would be at position -1
    committed = torch.tensor([1, 2, 0, 0, 0, 0, 0, 0])
    left_of_2, below_1 = [0.1, 0.2, 0.3, 0.4], [0.97, 0.01, 0.01, 0.01]
    laws = NeighbourLaws(V, ROW, torch.device("cpu"))
    laws.add(torch.tensor([2]), torch.tensor([7]), torch.tensor([left_of_2]), committed, 2)  # nothing final above 7
    laws.add(torch.tensor([0]), torch.tensor([3]), torch.tensor([below_1]), committed, 2)  # below position 0's token 1
    q, seen = laws.window_law(2, torch.tensor([3, 1]), committed, torch.ones(2, V, dtype=torch.bool))
    assert seen.tolist() == [True, True]
    # position 2: the left law of token 2 alone (reading position 0's token there would mix in below_1)
    assert torch.allclose(q[0], torch.tensor(left_of_2), atol=1e-6)
    # position 3: its left neighbour is the draft 3 (never learned), its token above is 1
    assert torch.allclose(q[1], torch.tensor(below_1), atol=1e-6)


def test_the_window_law_has_not_seen_neighbours_it_never_learned():
    laws = laws_after([2], [1], [[0.7, 0.1, 0.1, 0.1]], [0, 2, 0, 0], 2, row_length=0)
    _, seen = laws.window_law(2, torch.tensor([1, 2]), torch.tensor([0, 2, 0, 0]), torch.ones(2, V, dtype=torch.bool))
    assert seen.tolist() == [True, False]  # token 2 left of position 2; draft 1 left of 3: never seen


def test_the_window_log_law_is_the_window_law_before_it_is_restricted_and_normalised():
    # What the Gumbel rule's candidates rank (Drafter.candidates_from_law): the logs, restricted
    # to the allowed tokens, normalise to the window law, so they rank its tokens as it does.
    generator = torch.Generator().manual_seed(3)
    committed = torch.tensor([0, 1, 2, 3, 1, 0, 0, 0, 0])
    laws = NeighbourLaws(V, ROW, torch.device("cpu"))
    for _ in range(6):  # passes of three nodes each, random p's behind random tokens
        laws.add(torch.randint(0, V, (3,), generator=generator), torch.tensor([4, 5, 6]),
                 torch.softmax(torch.randn(3, V, generator=generator), -1), committed, 5)
    drafts, rows = torch.tensor([2, 0, 3, 1]), 4
    allowed = torch.ones(rows, V, dtype=torch.bool)
    allowed[1, 2] = allowed[3, 0] = False
    q, seen = laws.window_law(5, drafts, committed, allowed)
    log_law, log_seen = laws.window_log_law(5, drafts, committed, rows)
    restricted = log_law.masked_fill(~allowed, float("-inf"))
    assert torch.equal(seen, log_seen) and bool(seen.all())
    assert torch.allclose(torch.softmax(restricted, -1), q, atol=1e-6)
    assert torch.equal(restricted.argsort(dim=-1, descending=True, stable=True), q.argsort(dim=-1, descending=True, stable=True))
    # Control: logs off by a factor (not a constant) would not normalise to the law.
    assert not torch.allclose(torch.softmax(2.0 * restricted, -1), q, atol=1e-3)


def test_compact_rows_that_keep_every_entry_equal_dense_rows():
    generator = torch.Generator().manual_seed(0)
    dense, compact = DenseRows(6, torch.device("cpu")), TopRows(6, 6, torch.device("cpu"))
    for _ in range(5):  # passes whose nodes repeat rows, as a pass's nodes repeat tokens
        rows = torch.randint(0, 6, (7,), generator=generator)
        p = torch.rand(7, 6, generator=generator)
        p[p < 0.3] = 0.0
        dense.add(rows, p)
        compact.add(rows, p)
    everyone = torch.arange(6)
    assert torch.allclose(compact.read(everyone), dense.read(everyone), atol=1e-6)


def _kept_sums_reference(vocab: int, kept: int, passes) -> tuple:
    """What TopRows keeps, written out densely, one row at a time: a touched row's kept sums plus
    each new p's `kept` largest entries, of which the row keeps its `kept` largest sums. Returns
    (sums [V, V], entries dropped by the merges)."""
    sums, dropped = torch.zeros(vocab, vocab, dtype=torch.float64), 0
    for rows, p in passes:
        merged = {}
        for row, p_row in zip(rows.tolist(), p.double()):
            top = p_row.topk(kept)
            merged.setdefault(row, sums[row].clone())[top.indices] += top.values
        for row, candidate in merged.items():
            dropped += max(0, int((candidate > 0).sum()) - kept)
            keep = candidate.topk(kept).indices
            sums[row] = 0.0
            sums[row, keep] = candidate[keep]
    return sums, dropped


def _merged_passes(seed: int = 0):
    """Passes of 9 nodes over 8 tokens whose rows repeat (a pass's nodes repeat tokens), with
    distinct random p's (no ties) that give no mass to a third of the tokens."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(6):
        rows = torch.randint(0, 4, (9,), generator=generator)  # four rows touched over and over
        p = torch.rand(9, 8, generator=generator)
        p[torch.rand(9, 8, generator=generator) < 0.3] = 0.0
        out.append((rows, p))
    return out


def _top_rows_gap(passes, kept: int = 3) -> tuple:
    """(the largest difference between TopRows and the reference, entries the merges dropped)."""
    compact = TopRows(8, kept, torch.device("cpu"))
    for rows, p in passes:
        compact.add(rows, p)
    reference, dropped = _kept_sums_reference(8, kept, passes)
    return float((compact.read(torch.arange(8)).double() - reference).abs().max()), dropped


def test_compact_rows_that_drop_entries_keep_each_rows_largest_sums():
    """Rows that keep 3 of 8 entries, merged over passes that touch them many times: the kept
    entries are exactly the reference's, and merges really dropped entries."""
    gap, dropped = _top_rows_gap(_merged_passes())
    assert dropped > 20, f"the merges dropped only {dropped} entries"
    assert gap < 1e-5, f"kept sums differ from the reference by {gap:.2e}"


def test_planted_control_a_merge_that_keeps_the_smallest_sums_is_caught():
    from exactness_tools import planted_edit

    with planted_edit(TopRows, "add", "descending=True", "descending=False") as calls:
        gap, _ = _top_rows_gap(_merged_passes())
    assert calls.count > 0 and gap > 0.1, f"a merge that keeps the smallest sums went unnoticed (gap {gap:.2e})"


def test_compact_rows_keep_each_rows_largest_sums():
    rows = TopRows(5, 2, torch.device("cpu"))
    # row 3 gets two p's in one pass, row 1 one p: each p keeps its 2 largest entries, and each row
    # the 2 largest of their sums (row 3: token 1 0.5 + 0.5, token 4 0.5, token 3 0.4 dropped)
    rows.add(torch.tensor([3, 1, 3]), torch.tensor([[0.1, 0.5, 0.0, 0.4, 0.0],
                                                    [0.0, 0.0, 0.2, 0.3, 0.5],
                                                    [0.0, 0.5, 0.0, 0.0, 0.5]]))
    assert torch.allclose(rows.read(torch.tensor([3, 1])), torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.5],
                                                                         [0.0, 0.0, 0.0, 0.3, 0.5]]))
    # a later pass adds to kept entries and may displace one: token 3 (0.95) displaces 4 (0.5)
    rows.add(torch.tensor([3]), torch.tensor([[0.0, 0.25, 0.0, 0.95, 0.0]]))
    assert torch.allclose(rows.read(torch.tensor([3])), torch.tensor([[0.0, 1.25, 0.0, 0.95, 0.0]]))
    assert torch.equal(rows.read(torch.tensor([0, 2])), torch.zeros(2, 5))  # untouched rows stay empty


def test_planted_control_a_merge_that_drops_the_rows_old_entries_is_caught(monkeypatch):
    # The equality test above must be able to fail: the same merge, but each touched row starting
    # from nothing (its old sums lost), differs from the dense sums after a second pass.
    planted = TopRows(4, 4, torch.device("cpu"))
    real_add = TopRows.add
    calls = []

    def forgetting_add(self, rows, p):
        calls.append(1)
        self.sums.index_fill_(0, rows, 0.0)
        real_add(self, rows, p)

    dense = DenseRows(4, torch.device("cpu"))
    monkeypatch.setattr(TopRows, "add", forgetting_add)
    for rows, p in ((torch.tensor([1]), torch.tensor([[0.5, 0.5, 0.0, 0.0]])),
                    (torch.tensor([1]), torch.tensor([[0.0, 0.5, 0.5, 0.0]]))):
        planted.add(rows, p)
        dense.add(rows, p)
    assert calls and not torch.allclose(planted.read(torch.tensor([1])), dense.read(torch.tensor([1])))


def test_the_families_image_codes_get_compact_rows_the_memory_plan_counts_and_a_huge_vocabulary_none(monkeypatch):
    assert law_row_entries(567) == 567  # the demo: dense
    for codes in (8194, 16384, 32772):  # Lumina-mGPT's, Janus-Pro's and Emu3's sampled tokens
        assert law_row_entries(codes) == memory.LAW_MAX_KEPT
        laws = make_laws(codes, 48, torch.device("cpu"))
        assert isinstance(laws.sums, TopRows) and laws.sums.kept == memory.LAW_MAX_KEPT
        allocated = sum(t.numel() * t.element_size() for t in (laws.sums.ids, laws.sums.sums))
        assert allocated == law_table_bytes(codes) <= memory.LAW_COMPACT_MAX_BYTES
    assert law_row_entries(184622) == 15  # a whole text vocabulary: fewer sums a row
    monkeypatch.setattr(memory, "LAW_DENSE_MAX_BYTES", 0)
    monkeypatch.setattr(memory, "LAW_COMPACT_MAX_BYTES", 2 * 1001 * 7 * 12)  # fewer than LAW_MIN_KEPT a row
    assert law_row_entries(1000) is None and make_laws(1000, 40, torch.device("cpu")) is None
    assert law_table_bytes(1000) == 0

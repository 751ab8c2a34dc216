"""The flat prefix index: node ids and their field columns, id reuse, runs created at once, and the
exact parent + key rule of every lookup."""

import zlib

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from atom.kv.prefix_index import NO_NODE, PrefixIndex


def keys(*hashes: int) -> list[bytes]:
    return [h.to_bytes(8, "little") for h in hashes]


def test_a_fresh_run_gets_consecutive_ids_chained_to_each_other():
    index = PrefixIndex()
    nodes = index.extend(NO_NODE, 0, [11, 12, 13], keys(11, 12, 13), 3)
    assert nodes == [0, 1, 2]
    assert [index.parent[n] for n in nodes] == [NO_NODE, 0, 1]
    assert [index.depth[n] for n in nodes] == [0, 1, 2]
    assert [index.refs[n] for n in nodes] == [1, 1, 0]  # each held by its child; the tip by nobody yet
    index.ref(nodes[-1])
    index.check_integrity([nodes[-1]])
    assert index.chain([11, 12, 13], keys(11, 12, 13), 3) == nodes


def test_releasing_the_tip_removes_the_chain_and_its_ids_are_reused_with_clean_fields():
    index = PrefixIndex()
    nodes = index.extend(NO_NODE, 0, [1, 2, 3], keys(1, 2, 3), 3)
    index.ref(nodes[-1])
    index.hits[nodes[0]] = 4
    index.unref(nodes[-1])
    assert len(index) == 0 and index.chain([1, 2, 3], keys(1, 2, 3), 3) == []
    index.check_integrity([])
    again = index.extend(NO_NODE, 0, [7, 8], keys(7, 8), 2)
    assert sorted(again) == [0, 1]  # the lowest vacant ids first
    assert [index.hits[n] for n in again] == [0, 0] and [index.comp[n] for n in again] == [-1, -1]
    index.ref(again[-1])
    index.check_integrity([again[-1]])


def test_a_fresh_run_costs_one_dict_entry_and_its_successors_are_found_by_position():
    index = PrefixIndex()
    nodes = index.extend(NO_NODE, 0, [11, 12, 13, 14], keys(11, 12, 13, 14), 4)
    more = index.extend(nodes[-1], 4, [0] * 4 + [15, 16], keys(0, 0, 0, 0, 15, 16), 6)  # the next chunk
    assert more == [4, 5] and len(index._heads) == 1  # block 4's id follows block 3's: no new head
    index.ref(more[-1])
    index.check_integrity([more[-1]])
    assert index.chain([11, 12, 13, 14, 15, 16], keys(11, 12, 13, 14, 15, 16), 6) == nodes + more


def test_a_run_under_another_parent_may_reuse_a_hash_and_each_lookup_serves_its_own_prefix():
    index = PrefixIndex()
    first = index.extend(NO_NODE, 0, [1, 2], keys(1, 2), 2)
    index.ref(first[-1])
    other = index.extend(NO_NODE, 0, [9, 2, 5], keys(9, 2, 5), 3)  # hash 2 is block 1 under another parent
    assert len(other) == 3 and [index.parent[n] for n in other] == [NO_NODE, other[0], other[1]]
    index.ref(other[-1])
    index.check_integrity([first[-1], other[-1]])
    assert index.chain([9, 2, 5], keys(9, 2, 5), 3) == other and index.chain([1, 2], keys(1, 2), 2) == first
    assert index.chain([1, 2, 5], keys(1, 2, 5), 3) == first  # block 2 exists only under the other prefix


def test_a_run_stops_where_its_head_hash_is_another_prefixs():
    index = PrefixIndex()
    first = index.extend(NO_NODE, 0, [1, 2], keys(1, 2), 2)
    index.ref(first[-1])
    assert index.extend(NO_NODE, 0, [1, 3], [b"other", keys(3)[0]], 2) == []  # root hash 1 with another key
    single = index.extend(NO_NODE, 0, [7], keys(7), 1)
    index.ref(single[-1])
    # block 1 under root 7 has hash 1, the first prefix's root's (a head): the run stops, even though
    # its node would have been a successor (id 3 after root 7's 2) needing no dict entry
    assert index.extend(single[-1], 1, [7, 1], keys(7, 1), 2) == [] and len(index) == 3
    index.check_integrity([first[-1], single[-1]])


def test_a_run_stops_at_a_later_head_whose_hash_another_head_holds():
    index = PrefixIndex()
    roots = [index.extend(NO_NODE, 0, [h], keys(h), 1) for h in (1, 2, 3)]  # ids 0, 1, 2
    for r in roots:
        index.ref(r[-1])
    index.unref(roots[0][-1])
    index.unref(roots[2][-1])  # reused next: 2, then 0
    # reused 2 becomes root 8; reused 0 (not 2 + 1) would be a head with hash 2, root 1's: stop there
    assert index.extend(NO_NODE, 0, [8, 2, 9], keys(8, 2, 9), 3) == [2]
    index.ref(2)
    # the reused 0 becomes root 5; the first never-used id, 3, is not 0 + 1: a head with hash 2 again
    assert index.extend(NO_NODE, 0, [5, 2], keys(5, 2), 2) == [0]
    index.ref(0)
    index.check_integrity([0, 1, 2])
    assert len(index) == 3 and index.chain([8, 2], keys(8, 2), 2) == [2]


def test_a_run_repeating_a_hash_within_itself_is_kept_whole():
    index = PrefixIndex()
    nodes = index.extend(NO_NODE, 0, [5, 6, 5], keys(5, 6, 5), 3)
    assert len(nodes) == 3 and len(index) == 3
    index.ref(nodes[-1])
    index.check_integrity([nodes[-1]])
    assert index.chain([5, 6, 5], keys(5, 6, 5), 3) == nodes


def test_reused_ids_become_heads_unless_they_follow_their_parent():
    index = PrefixIndex()
    a = index.extend(NO_NODE, 0, [1, 2, 3], keys(1, 2, 3), 3)
    index.ref(a[-1])
    b = index.extend(NO_NODE, 0, [4, 5], keys(4, 5), 2)  # ids 3, 4
    index.ref(b[-1])
    index.unref(a[-1])  # ids 2, 1, 0 go back (0 on top)
    c = index.extend(b[-1], 2, [0, 0, 6, 7, 8, 9], keys(0, 0, 6, 7, 8, 9), 6)  # reused 0, 1, 2, then new 5
    assert c == [0, 1, 2, 5]
    assert [index.parent[n] for n in c] == [4, 0, 1, 2]
    assert index.holds(0) and index.holds(1) and len(index._heads) == 3  # 4's root, 0 (not 4 + 1), 5 (not 2 + 1)
    index.ref(c[-1])
    index.check_integrity([b[-1], c[-1]])
    assert index.chain([4, 5, 6, 7, 8, 9], keys(4, 5, 6, 7, 8, 9), 6) == b + c


def test_a_lookup_rejects_a_node_whose_key_differs():
    index = PrefixIndex()
    nodes = index.extend(NO_NODE, 0, [1, 2], keys(1, 2), 2)
    index.ref(nodes[-1])
    assert index.chain([1, 2], [keys(1)[0], b"other"], 2) == nodes[:1]


def test_a_lookup_stops_at_the_first_absent_hash_and_never_starts_below_block_0():
    index = PrefixIndex()
    nodes = index.extend(NO_NODE, 0, [1, 2, 3], keys(1, 2, 3), 3)
    index.ref(nodes[-1])
    assert index.chain([1, 99, 3], keys(1, 99, 3), 3) == nodes[:1]  # block 2's node exists, block 1 is absent
    assert index.chain([2, 3], keys(2, 3), 2) == []  # block 1's node is not a root
    assert index.chain([1, 2, 3], keys(1, 2, 3), 2) == nodes[:2] and index.chain([1], keys(1), 0) == []


def _one_run(n: int) -> tuple[PrefixIndex, list[int], list[int]]:
    """An index holding one run of ``n`` blocks (hashes 1..n), referenced at its tip."""
    index = PrefixIndex()
    hashes = list(range(1, n + 1))
    nodes = index.extend(NO_NODE, 0, hashes, keys(*hashes), n)
    index.ref(nodes[-1])
    return index, hashes, nodes


def test_a_lookup_takes_a_run_whole_where_the_prompt_repeats_it_and_stops_where_the_prompt_leaves_it():
    index, hashes, nodes = _one_run(40)
    assert index.chain(hashes, keys(*hashes), 40) == nodes
    assert index.chain(hashes, keys(*hashes), 17) == nodes[:17]
    for diverge in (1, 2, 3, 20, 38, 39):  # the prompt's own blocks from block ``diverge`` on
        mine = hashes[:diverge] + [1000 + j for j in range(diverge, 45)]
        assert index.chain(mine, keys(*mine), 45) == nodes[:diverge], diverge


def test_a_lookup_through_a_run_stops_at_a_block_whose_key_differs_though_every_hash_matches():
    # a hash collision inside the run: block 25's hash is the run's but its tokens are not
    index, hashes, nodes = _one_run(40)
    mine = keys(*hashes)
    mine[25] = b"other tokens"
    assert index.chain(hashes, mine, 40) == nodes[:25]
    mine = keys(*hashes)
    mine[39] = b"other tokens"  # the last block: the one probe of a whole run
    assert index.chain(hashes, mine, 40) == nodes[:39]


def test_a_lookup_through_a_run_stops_at_a_node_that_is_not_its_parents_successor():
    # the run's hashes would match to its end, but block 12 continues another parent
    index, hashes, nodes = _one_run(30)
    index.parent[12] = 5  # (a corrupted parent: no lookup may pass it)
    assert index.chain(hashes, keys(*hashes), 30) == nodes[:12]


def test_the_columns_grow_in_place_so_a_pool_may_keep_a_reference():
    index = PrefixIndex()
    comp = index.comp
    nodes = index.extend(NO_NODE, 0, list(range(1, 301)), keys(*range(1, 301)), 300)
    assert index.comp is comp and len(comp) == index.capacity >= 300
    index.ref(nodes[-1])
    index.check_integrity([nodes[-1]])
    assert index.holds(nodes[0]) and not index.holds(index.capacity)
    index.unref(nodes[-1])
    assert not index.holds(nodes[0]) and len(index) == 0


class IndexMachine(RuleBasedStateMachine):
    """Random publications and releases under colliding hashes (2 bits, with or without the prefix):
    every lookup returns exactly the indexed nodes whose chain of keys is the query's, longest first
    match, and the integrity checks hold after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.index = PrefixIndex()
        self.tips: list[tuple[int, list[bytes]]] = []  # (tip node, its key path) held by a "request"

    @initialize(forget_prefix=st.booleans())
    def setup(self, forget_prefix):
        self.forget_prefix = forget_prefix

    def hashes(self, path: list[bytes]) -> list[int]:
        out, h = [], 0
        for key in path:
            h = (zlib.crc32(key) if self.forget_prefix else zlib.crc32(key, h)) & 3
            out.append(h)
        return out

    @rule(data=st.data(), new=st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=5))
    def publish(self, data, new):
        tip, path = data.draw(st.sampled_from([(NO_NODE, [])] + self.tips))
        full = path + new
        nodes = self.index.extend(tip, len(path), self.hashes(full), full, len(full))
        if nodes:
            self.index.ref(nodes[-1])
            self.tips.append((nodes[-1], full[:len(path) + len(nodes)]))

    @precondition(lambda self: self.tips)
    @rule(data=st.data())
    def release(self, data):
        tip, _ = self.tips.pop(data.draw(st.integers(0, len(self.tips) - 1)))
        self.index.unref(tip)

    @rule(query=st.lists(st.sampled_from([b"a", b"b", b"c"]), max_size=7))
    def lookups_follow_the_keys_exactly(self, query):
        index = self.index
        paths = {}
        for n in index.live():
            path, m = [], n
            while m != NO_NODE:
                path.append(index.key[m])
                m = index.parent[m]
            paths[tuple(reversed(path))] = n
        expect = []
        while tuple(query[:len(expect) + 1]) in paths and len(expect) < len(query):
            expect.append(paths[tuple(query[:len(expect) + 1])])
        assert index.chain(self.hashes(query), query, len(query)) == expect

    @invariant()
    def consistent(self):
        index = self.index
        index.check_integrity([tip for tip, _ in self.tips])
        reachable = set()  # no block is published here: a node lives exactly while a held tip is under it
        for tip, path in self.tips:
            n, depth = tip, len(path)
            while n != NO_NODE:
                depth -= 1
                assert index.key[n] == path[depth] and index.depth[n] == depth
                reachable.add(n)
                n = index.parent[n]
            assert depth == 0
        assert set(index.live()) == reachable and len(index) == len(reachable)


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_block_keys_pack_token_ids_in_4_bytes_and_a_token_id_past_32_bits_is_refused():
    import pytest

    from atom.kv.kv_block import chain_hashes

    hashes, keys = [], []
    chain_hashes(list(range(1, 9)), 4, 2, hashes, keys)
    assert [len(k) for k in keys] == [16, 16] and len(set(hashes)) == 2
    with pytest.raises(ValueError, match="outside the 32-bit range in blocks 0..0"):
        chain_hashes([1, 2, 2**31, 4], 4, 1, [], [])

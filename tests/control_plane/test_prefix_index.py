"""The flat prefix index: node ids and their field columns, id reuse, runs created at once, and the
exact parent + key rule of every lookup."""

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


def test_a_run_stops_where_another_prefix_holds_the_hash():
    index = PrefixIndex()
    first = index.extend(NO_NODE, 0, [1, 2], keys(1, 2), 2)
    index.ref(first[-1])
    other = index.extend(NO_NODE, 0, [9, 2, 5], keys(9, 2, 5), 3)  # hash 2 is block 1 under another parent
    assert len(other) == 1 and index.block_hash[other[0]] == 9
    index.ref(other[-1])
    index.check_integrity([first[-1], other[-1]])
    assert index.chain([9, 2], keys(9, 2), 2) == other  # the collision is never served


def test_a_run_repeating_a_hash_within_itself_stops_at_the_repeat():
    index = PrefixIndex()
    nodes = index.extend(NO_NODE, 0, [5, 6, 5], keys(5, 6, 5), 3)
    assert len(nodes) == 2 and len(index) == 2
    index.ref(nodes[-1])
    index.check_integrity([nodes[-1]])


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

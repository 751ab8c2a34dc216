"""HostPool accounting: sizing, one copy per node, orders per step, eviction that never takes a page a
pending load reads, and a node kept alive by its copy alone."""

import pytest

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.host_pool import HostPool
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, SWA
from atom.kv.prefix_index import PrefixIndex
from atom.kv.tables import HostCopy
from support.control_plane import TINY

LAYOUT = KvLayout.for_chunks(Dsv4KvSpec(**TINY), 12, SchedulerConfig(max_model_len=256), CacheConfig(chunk_pages=3))


def pool_with_nodes(host_chunks: int, n: int):
    index = PrefixIndex()
    nodes = index.extend(-1, 0, list(range(1, n + 1)), [bytes([j]) for j in range(n)], n)
    index.ref(nodes[-1])  # a request's tip keeps the chain alive
    return HostPool(LAYOUT, host_chunks * LAYOUT.chunk_bytes, index), index, nodes


def test_a_pool_smaller_than_one_chunk_is_refused_with_the_chunk_size():
    with pytest.raises(ValueError, match=f"less than one arena chunk \\({LAYOUT.chunk_bytes} B\\)"):
        HostPool(LAYOUT, LAYOUT.chunk_bytes - 1, PrefixIndex())


def test_the_start_up_line_gives_the_size_and_capacity():
    pool, _, _ = pool_with_nodes(3, 1)
    assert pool.describe().startswith(f"host KV tier: 3 chunks of {LAYOUT.chunk_bytes} B = ")
    assert f"{3 * LAYOUT.compress_pages_per_chunk * LAYOUT.spec.block_size:,} compressed tokens" in pool.describe()


def test_a_node_keeps_one_copy_and_the_step_gets_one_order_per_owner_and_direction():
    pool, index, nodes = pool_with_nodes(2, 3)
    assert pool.store(COMPRESS, nodes[0], 10) and pool.store(COMPRESS, nodes[0], 11)  # the second: already kept
    assert pool.store(SWA, nodes[1], 4)
    stores, loads = pool.take_orders()
    assert stores == (HostCopy(SWA, (4,), (index.host_swa[nodes[1]],)), HostCopy(COMPRESS, (10,), (index.host_comp[nodes[0]],)))
    assert loads == ()
    pool.load(COMPRESS, nodes[0], 7)
    assert pool.take_orders() == ((), (HostCopy(COMPRESS, (index.host_comp[nodes[0]],), (7,)),))
    assert pool.stats.host_bytes_out == pool.page_bytes[COMPRESS] + pool.page_bytes[SWA]
    assert pool.stats.host_bytes_in == pool.page_bytes[COMPRESS]
    pool.check_integrity()
    index.check_integrity([nodes[-1]])


def test_a_full_pool_drops_the_oldest_copy_but_never_one_a_pending_load_reads():
    pool, index, nodes = pool_with_nodes(1, LAYOUT.chunk_pages + 2)
    first, second = nodes[0], nodes[1]
    for j in range(LAYOUT.chunk_pages):  # one chunk of SWA copies: the pool is full
        assert pool.store(SWA, nodes[j], j)
    pool.take_orders()
    pool.load(SWA, first, 100)  # the oldest copy is being read this step
    assert pool.store(SWA, nodes[-2], 50)  # so the next oldest goes
    assert index.host_swa[first] >= 0 and index.host_swa[second] == -1
    pool.protect(SWA, nodes[-2])
    others = nodes[2:LAYOUT.chunk_pages]
    for n in others:
        pool.protect(SWA, n)
    assert not pool.store(SWA, nodes[-1], 51)  # every copy is read by a pending load: no room
    pool.check_integrity()
    index.check_integrity([nodes[-1]])


def test_a_store_whose_copy_was_dropped_in_the_same_step_is_not_ordered():
    pool, index, nodes = pool_with_nodes(1, 2)
    pool.store(COMPRESS, nodes[0], 3)
    page = index.host_comp[nodes[0]]
    pool.drop(COMPRESS, page)
    assert pool.take_orders() == ((), ())


def test_a_copy_alone_keeps_its_node_and_dropping_it_removes_the_node():
    pool, index, nodes = pool_with_nodes(1, 1)
    pool.store(COMPRESS, nodes[0], 0)
    index.unref(nodes[0])  # the request's tip goes: the copy alone holds the node
    assert index.holds(nodes[0]) and len(index) == 1
    pool.clear()
    assert len(index) == 0
    pool.check_integrity()


def test_a_host_tier_without_prefix_caching_is_refused():
    with pytest.raises(ValueError, match="needs prefix caching"):
        CacheConfig(host_kv_cache_bytes=1 << 20, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="host_kv_write_policy='around'; accepted: back, through"):
        CacheConfig(host_kv_write_policy="around")

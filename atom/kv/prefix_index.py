"""The published prefixes, block by block: one verified chain that both pools' cached blocks hang on.

A node stands for one full block of tokens *under one exact prefix*: it records its parent node and
its own token key (the packed token ids), and is found from its parent by the chained block hash. A
lookup walks from block 0 and accepts a node only if its parent is the node accepted for the block
before and its key equals the query's, so a hash collision (even with a truncated hash) can never
serve KV computed under another prefix.

Layout: a node is an integer id (``NO_NODE``, -1, is none), and every field is a flat list indexed by
it (``block_hash``, ``parent``, ``key``, ``depth``, ``refs``, ``comp``, ``swa``, ``host_comp``,
``host_swa``, ``hits``). Publishing a prefix therefore creates no Python object per block (only the
bytes of its key, which the garbage collector does not track), and the collector walks a dozen lists,
not a node per cached block.

Runs: a chunk of a prompt publishes its blocks as one run of new nodes, and a run drawn from ids never
used before gets consecutive ids, each the parent of the next. A node whose id is its parent's + 1 is
a *successor*: a lookup reaches it from its parent by position (``parent + 1``, checked by its parent
field and hash). Every other node, a root (block 0) or the first node of a run, is a *head*, found by
hash in one dict (``_heads``). So a run of ``k`` new blocks costs one dict entry, not ``k``: the dict
holds one entry per run, and its inserts and probes, each a cache miss at a random slot of a large
table, are paid once per run. Two children of one parent never share a hash (creating one first looks
for the other), and two heads never share a hash (the dict holds one; a run whose head's hash another
head holds stops there, its blocks stay private).

Ids of removed nodes are reused (a stack, the most recently removed on top) before ids never used;
the lists grow by doubling, in place, so a pool may keep a reference to its column. The block manager
sizes the index at construction for a node per block its pools can publish (``capacity``), so a
server does not stop inside a step to copy every column (0.6 ms at 32K nodes, measured) while it
fills.

Each pool publishes at most one block per node (``comp[n]`` / ``swa[n]``: the block id, or -1); the
host tier keeps at most one copy of each per node (``host_comp[n]`` / ``host_swa[n]``: the host page,
or -1). A node lives while a block or host copy is published at it, a child node hangs on it, or a
request holds it as the tip of its published chain (``refs`` counts all four); the last release
removes it and walks up the chain. A removed node's fields are back at their vacant values (-1, 0,
an empty key), so creating one writes only its identity.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from atom.kv.int_runs import id_run

__all__ = ["NO_NODE", "PrefixIndex"]

NO_NODE = -1  # "no node": the parent of a block-0 node, an unpublished block, a request with no chain
_HELD = -2  # (internal) the hash is another prefix's: no node may be created for it here


def _is_successor(n: int, parent: int) -> bool:
    """Whether node ``n`` under ``parent`` is found by position (its id follows its parent's), not in
    the hash dict as a head."""
    return parent >= 0 and n == parent + 1


class PrefixIndex:
    """Nodes of verified prefixes: heads by hash, successors by position; node fields in flat lists."""

    def __init__(self, capacity: int = 0) -> None:
        """``capacity``: ids to make room for now (more are added by doubling when needed)."""
        self._heads: dict[int, int] = {}  # hash -> head node (a root or the first node of a run)
        self.block_hash: list[int] = []
        self.parent: list[int] = []
        self.key: list[bytes] = []
        self.depth: list[int] = []  # the node's block index in the prompt
        self.refs: list[int] = []
        self.comp: list[int] = []  # the compressed block published here, or -1
        self.swa: list[int] = []  # the SWA block published here, or -1
        self.host_comp: list[int] = []  # the host page holding a copy of the compressed block, or -1
        self.host_swa: list[int] = []  # the host page holding a copy of the SWA block, or -1
        self.hits: list[int] = []  # prefix hits that claimed this node's blocks (write-through)
        self._free: list[int] = []  # removed ids, reused first (the most recently removed on top)
        self._fresh = 0  # ids from here to the capacity were never used
        if capacity > 0:
            self._grow(capacity)

    def __len__(self) -> int:
        return self._fresh - len(self._free)  # every id below _fresh is live or reused-vacant

    @property
    def capacity(self) -> int:
        return len(self.refs)

    def live(self) -> list[int]:
        """The ids of every indexed node (a pass over the ids; for checks, not the hot path)."""
        free = set(self._free)
        return [n for n in range(self._fresh) if n not in free]

    def describe(self, n: int) -> str:
        """One node's fields, for assertion messages."""
        return (f"node {n} (hash {self.block_hash[n]:#x}, depth {self.depth[n]}, parent {self.parent[n]}, "
                f"refs {self.refs[n]}, comp {self.comp[n]}, swa {self.swa[n]}, host_comp {self.host_comp[n]}, "
                f"host_swa {self.host_swa[n]})")

    # ---- lookups ------------------------------------------------------------------------------
    def chain(self, hashes: Sequence[int], keys: Sequence[bytes], limit: int) -> list[int]:
        """The verified nodes of blocks ``0 .. k-1`` (k <= ``limit``), stopping at the first miss.

        Where the chain continues a run of successors (a prompt that shares a prefix published in
        one run), the run is taken at once: the length that matches is found by the chained hashes
        (a binary search: block ``i`` of the run matches only if every block before it does, hash
        collisions aside), then verified exactly, parents and keys, by two list comparisons in C.
        A run that fails the exact check (a collision) is walked block by block, as is every block
        that is not its parent's successor."""
        if limit <= 0:
            return []
        heads, parent_of, hash_of, key_of = self._heads, self.parent, self.block_hash, self.key
        n = heads.get(hashes[0])
        if n is None or parent_of[n] != NO_NODE or key_of[n] != keys[0]:
            return []
        out = [n]
        j = 1
        while j < limit:
            c = n + 1  # the successor, if the block continues its parent's run (an id past every used one exists)
            if parent_of[c] == n and hash_of[c] == hashes[j]:
                k = self._run_length(c, hashes, j, limit)
                if k > 1 and parent_of[c:c + k] == id_run(n, n + k) and key_of[c:c + k] == keys[j:j + k]:
                    out += id_run(c, c + k)
                    n, j = c + k - 1, j + k
                    continue
            else:
                c = heads.get(hashes[j])
                if c is None or parent_of[c] != n:
                    break
            if key_of[c] != keys[j]:
                break
            out.append(c)
            n, j = c, j + 1
        return out

    def _run_length(self, c: int, hashes: Sequence[int], j: int, limit: int) -> int:
        """How many blocks from ``j`` on match the hashes of nodes ``c, c+1, ...`` (block ``j`` does):
        the longest stretch that the chained hashes say matches (not yet verified)."""
        hash_of = self.block_hash
        hi = limit - j
        if hi > len(hash_of) - c:
            hi = len(hash_of) - c
        if hash_of[c + hi - 1] == hashes[j + hi - 1]:
            return hi  # (a prompt that repeats to its end: one probe)
        lo, hi = 1, hi - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if hash_of[c + mid - 1] == hashes[j + mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _child(self, parent: int, h: int, key: bytes) -> int:
        """The node of the block with hash ``h`` and key ``key`` under ``parent``; ``NO_NODE`` when
        there is none and one may be created; ``_HELD`` when ``h`` is another prefix's (a head
        elsewhere, or a child of ``parent`` with another key)."""
        if parent >= 0:
            n = parent + 1
            if n < len(self.parent) and self.parent[n] == parent and self.block_hash[n] == h:
                return n if self.key[n] == key else _HELD
        n = self._heads.get(h)
        if n is None:
            return NO_NODE
        return n if self.parent[n] == parent and self.key[n] == key else _HELD

    def holds(self, n: int) -> bool:
        """Whether node ``n`` is indexed (alive)."""
        if not (0 <= n < len(self.refs) and self.refs[n] > 0):
            return False
        return _is_successor(n, self.parent[n]) or self._heads.get(self.block_hash[n]) == n

    # ---- growth -------------------------------------------------------------------------------
    def extend(self, tip: int, first: int, hashes: Sequence[int], keys: Sequence[bytes], end: int) -> list[int]:
        """The nodes of blocks ``first .. end-1`` continuing the chain at ``tip`` (block ``first-1``'s
        node, ``NO_NODE`` for block 0), created where absent. Stops early where a hash is another
        prefix's (those blocks stay private). Each new node takes a reference on its parent; the
        caller references what it publishes and moves its own tip.

        The usual case, block ``first`` not indexed under ``tip``, creates the whole run at once: the
        hashes are chained, so no later block of it can be indexed either (but through a hash
        collision, which the run's head check and every lookup's parent and key checks catch)."""
        if end <= first:
            return []
        out: list[int] = []
        parent = tip
        for j in range(first, end):
            n = self._child(parent, hashes[j], keys[j])
            if n == NO_NODE:
                return out + self._create_run(parent, j, hashes[j:end], keys[j:end])
            if n == _HELD:
                break
            out.append(n)
            parent = n
        return out

    def _create_run(self, tip: int, first: int, hashes: Sequence[int], keys: Sequence[bytes]) -> list[int]:
        """New nodes for blocks ``first ..``, each the child of the one before, the first of ``tip``
        (the caller found no node for the first under ``tip``). Each holds a reference from its child
        (the last none yet). Reused ids are taken one by one, then ids never used as one consecutive
        run (its nodes after the first are successors: slice stores and no dict entry). Stops where a
        head's hash is another head's (returns the nodes made before it)."""
        out: list[int] = []
        parent, depth, i, k = tip, first, 0, len(hashes)
        free, heads = self._free, self._heads
        h_of, p_of, k_of, d_of, refs = self.block_hash, self.parent, self.key, self.depth, self.refs
        while free and i < k:  # reused ids
            n, h = free[-1], hashes[i]
            if not _is_successor(n, parent) and heads.setdefault(h, n) != n:
                break  # a head elsewhere holds the hash
            free.pop()
            h_of[n], p_of[n], k_of[n], d_of[n], refs[n] = h, parent, keys[i], depth, 1
            out.append(n)
            parent, depth, i = n, depth + 1, i + 1
        else:
            if i < k:  # ids never used, one consecutive run
                a, m = self._fresh, k - i
                if not _is_successor(a, parent) and heads.setdefault(hashes[i], a) != a:
                    m = 0
                if m:
                    if a + m >= len(refs):  # (one id past the used ones stays: a lookup reads it)
                        self._grow(a + m + 1 - len(refs))
                    b = a + m
                    h_of[a:b] = hashes[i:] if i else hashes
                    k_of[a:b] = keys[i:] if i else keys
                    ids = id_run(a, b)
                    p_of[a] = parent
                    p_of[a + 1:b] = ids[:-1]
                    d_of[a:b] = id_run(depth, depth + m)
                    refs[a:b] = [1] * m
                    self._fresh = b
                    out += ids
        if out:
            refs[out[-1]] = 0
            if tip >= 0:
                refs[tip] += 1
        return out

    def _grow(self, at_least: int) -> None:
        """Add never-used ids (at least ``at_least``, at least doubling), each list extended in place."""
        cap = len(self.refs)
        add = max(at_least, cap, 64)
        minus = [-1] * add
        zeros = [0] * add
        for col in (self.block_hash, self.depth, self.refs, self.hits):
            col += zeros
        for col in (self.parent, self.comp, self.swa, self.host_comp, self.host_swa):
            col += minus
        self.key += [b""] * add

    # ---- references ---------------------------------------------------------------------------
    def ref(self, n: int) -> None:
        self.refs[n] += 1

    def unref(self, n: int) -> None:
        """Drop one reference to node ``n`` (``NO_NODE``: nothing); unreferenced nodes are removed,
        walking up the chain."""
        refs, parent = self.refs, self.parent
        while n >= 0:
            r = refs[n] - 1
            assert r >= 0, f"unref of unreferenced {self.describe(n)}"
            refs[n] = r
            if r:
                return
            p = parent[n]
            if not _is_successor(n, p):  # a head
                del self._heads[self.block_hash[n]]
            self.key[n] = b""
            self.hits[n] = 0
            self._free.append(n)
            parent[n] = NO_NODE
            n = p

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self, tips: Iterable[int]) -> None:
        """refs == published blocks + host copies + children + holders' tips, for every node; parents
        and depths consistent; the heads, and only they, indexed by hash; no two children of one
        parent with one hash; every id indexed, reused-vacant or never used (with vacant fields)."""
        live = self.live()
        expect = {n: (self.comp[n] >= 0) + (self.swa[n] >= 0) + (self.host_comp[n] >= 0) + (self.host_swa[n] >= 0)
                  for n in live}
        children: set[tuple[int, int]] = set()
        for n in live:
            p, h = self.parent[n], self.block_hash[n]
            assert (p, h) not in children, f"{self.describe(n)}: a second child of {p} with its hash"
            children.add((p, h))
            if p >= 0:
                assert p in expect, f"{self.describe(n)}: parent not indexed"
                assert self.depth[n] == self.depth[p] + 1, f"{self.describe(n)}: depth is not its parent's + 1"
                expect[p] += 1
            else:
                assert self.depth[n] == 0, f"{self.describe(n)}: a root node not at block 0"
            head = not _is_successor(n, p)
            assert (self._heads.get(h) == n) == head, f"{self.describe(n)}: head {head} but the dict disagrees"
        for h, n in self._heads.items():
            assert n in expect and self.block_hash[n] == h, f"hash {h:#x} indexes a dropped or other node {n}"
        for tip in tips:
            assert tip in expect, f"tip {tip} not indexed"
            expect[tip] += 1
        for n in live:
            assert self.refs[n] == expect[n] and self.refs[n] > 0, f"{self.describe(n)}: expected refs {expect[n]}"
        free = set(self._free)
        assert len(free) == len(self._free), "a vacant node id listed twice"
        assert all(n < self._fresh for n in free), "a reused id beyond the used ones"
        assert self._fresh < self.capacity or self._fresh == 0, "no id past the used ones (a lookup reads it)"
        for n in [*free, *range(self._fresh, self.capacity)]:
            assert (self.refs[n], self.comp[n], self.swa[n], self.host_comp[n], self.host_swa[n], self.hits[n],
                    self.parent[n], self.key[n]) == (0, -1, -1, -1, -1, 0, -1, b""), f"dirty vacant {self.describe(n)}"

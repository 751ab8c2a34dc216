"""The published prefixes, block by block: one verified chain that both pools' cached blocks hang on.

A node stands for one full block of tokens *under one exact prefix*: it records its parent node and
its own token key (the packed token ids), and is found by the chained block hash. A lookup walks from
block 0 and accepts a node only if its parent is the node accepted for the block before and its key
equals the query's, so a hash collision (even with a truncated hash) can never serve KV computed
under another prefix.

Layout: a node is an integer id (``NO_NODE``, -1, is none), and every field is a flat list indexed by
it (``block_hash``, ``parent``, ``key``, ``depth``, ``refs``, ``comp``, ``swa``, ``host_comp``,
``host_swa``, ``hits``), plus one dict from hash to id. Publishing a prefix therefore creates no Python
object per block (only the bytes of its key, which the garbage collector does not track), and the
collector walks a dozen lists, not a node per cached block. Ids of removed nodes are reused (a stack,
lowest first); the lists grow by doubling, in place, so a pool may keep a reference to its column.

Each pool publishes at most one block per node (``comp[n]`` / ``swa[n]``: the block id, or -1); the
host tier keeps at most one copy of each per node (``host_comp[n]`` / ``host_swa[n]``: the host page,
or -1). A node lives while a block or host copy is published at it, a child node hangs on it, or a
request holds it as the tip of its published chain (``refs`` counts all four); the last release
removes it and walks up the chain. A removed node's fields are back at their vacant values (-1, 0,
an empty key), so creating one writes only its identity.
"""

from __future__ import annotations

from typing import Iterable, Sequence

__all__ = ["NO_NODE", "PrefixIndex"]

NO_NODE = -1  # "no node": the parent of a block-0 node, an unpublished block, a request with no chain


class PrefixIndex:
    """Hash -> node id, with exact parent and key checks on every lookup; node fields in flat lists."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
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
        self._free: list[int] = []  # vacant ids, the lowest on top

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def capacity(self) -> int:
        return len(self.refs)

    def live(self) -> list[int]:
        """The ids of every indexed node."""
        return list(self._ids.values())

    def describe(self, n: int) -> str:
        """One node's fields, for assertion messages."""
        return (f"node {n} (hash {self.block_hash[n]:#x}, depth {self.depth[n]}, parent {self.parent[n]}, "
                f"refs {self.refs[n]}, comp {self.comp[n]}, swa {self.swa[n]}, host_comp {self.host_comp[n]}, "
                f"host_swa {self.host_swa[n]})")

    # ---- lookups ------------------------------------------------------------------------------
    def chain(self, hashes: Sequence[int], keys: Sequence[bytes], limit: int) -> list[int]:
        """The verified nodes of blocks ``0 .. k-1`` (k <= ``limit``), stopping at the first miss."""
        out: list[int] = []
        ids, parent_of, key_of, parent = self._ids, self.parent, self.key, NO_NODE
        for j in range(limit):
            n = ids.get(hashes[j])
            if n is None or parent_of[n] != parent or key_of[n] != keys[j]:
                break
            out.append(n)
            parent = n
        return out

    def holds(self, n: int) -> bool:
        """Whether node ``n`` is indexed (alive)."""
        return 0 <= n < len(self.refs) and self.refs[n] > 0 and self._ids.get(self.block_hash[n]) == n

    # ---- growth -------------------------------------------------------------------------------
    def extend(self, tip: int, first: int, hashes: Sequence[int], keys: Sequence[bytes], end: int) -> list[int]:
        """The nodes of blocks ``first .. end-1`` continuing the chain at ``tip`` (block ``first-1``'s
        node, ``NO_NODE`` for block 0), created where absent. Stops early where a hash is taken by
        another prefix (those blocks stay private). Each new node takes a reference on its parent; the
        caller references what it publishes and moves its own tip."""
        if end <= first:
            return []
        run = hashes[first:end]
        if self._ids.keys().isdisjoint(run):  # the usual case: all new, one run (unless a hash repeats in it)
            nodes = self._create_run(tip, first, run, keys[first:end])
            if nodes:
                return nodes
        return self._extend_each(tip, first, hashes, keys, end)

    def _extend_each(self, tip: int, first: int, hashes: Sequence[int], keys: Sequence[bytes], end: int) -> list[int]:
        """:meth:`extend` block by block (some hashes are indexed already, or repeat in the run)."""
        ids = self._ids
        out: list[int] = []
        parent_of, key_of, parent = self.parent, self.key, tip
        for j in range(first, end):
            n = ids.get(hashes[j])
            if n is None:
                n = self._create_run(parent, j, (hashes[j],), (keys[j],))[0]
            elif parent_of[n] != parent or key_of[n] != keys[j]:
                break
            out.append(n)
            parent = n
        return out

    def _create_run(self, tip: int, first: int, hashes: Sequence[int], keys: Sequence[bytes]) -> list[int]:
        """New nodes for blocks ``first ..`` (absent hashes), each the child of the one before, the
        first of ``tip``. Each holds a reference from its child (the last none yet). Returns ``[]``,
        changing nothing, when a hash repeats within ``hashes`` (found by the dict's size after the
        insert, so the usual run builds no set to check)."""
        k = len(hashes)
        free = self._free
        if len(free) < k:
            self._grow(k - len(free))
        new = free[-k:]
        new.reverse()  # lowest id first
        ids = self._ids
        size = len(ids)
        ids.update(zip(hashes, new))
        if len(ids) != size + k:  # a repeated hash (the caller checked that none was indexed): undo
            for h in hashes:
                ids.pop(h, None)
            return []
        del free[-k:]
        h_of, p_of, k_of, d_of, refs = self.block_hash, self.parent, self.key, self.depth, self.refs
        a = new[0]
        b = a + k
        if new[-1] == b - 1 and new == list(range(a, b)):  # consecutive ids (fresh, or a chain removed whole)
            h_of[a:b] = hashes
            k_of[a:b] = keys
            p_of[a] = tip
            p_of[a + 1:b] = range(a, b - 1)
            d_of[a:b] = range(first, first + k)
            refs[a:b] = [1] * k
        else:
            parent, depth = tip, first
            for n, h, key in zip(new, hashes, keys):  # (plain stores: the interpreter specializes them)
                h_of[n] = h
                p_of[n] = parent
                k_of[n] = key
                d_of[n] = depth
                refs[n] = 1
                parent = n
                depth += 1
        refs[new[-1]] = 0
        if tip >= 0:
            refs[tip] += 1
        return new

    def _grow(self, at_least: int) -> None:
        """Add vacant ids (at least ``at_least``, at least doubling), each list extended in place."""
        cap = len(self.refs)
        add = max(at_least, cap, 64)
        minus = [-1] * add
        zeros = [0] * add
        for col in (self.block_hash, self.depth, self.refs, self.hits):
            col += zeros
        for col in (self.parent, self.comp, self.swa, self.host_comp, self.host_swa):
            col += minus
        self.key += [b""] * add
        self._free[:0] = range(cap + add - 1, cap - 1, -1)  # below the reused ids: those go first

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
            del self._ids[self.block_hash[n]]
            self.key[n] = b""
            self.hits[n] = 0
            self._free.append(n)
            p = parent[n]
            parent[n] = NO_NODE
            n = p

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self, tips: Iterable[int]) -> None:
        """refs == published blocks + host copies + children + holders' tips, for every node; parents
        and depths consistent; every id either indexed or vacant (with vacant fields)."""
        live = self.live()
        expect = {n: (self.comp[n] >= 0) + (self.swa[n] >= 0) + (self.host_comp[n] >= 0) + (self.host_swa[n] >= 0)
                  for n in live}
        for h, n in self._ids.items():
            assert self.block_hash[n] == h, f"{self.describe(n)} indexed under hash {h:#x}"
            p = self.parent[n]
            if p >= 0:
                assert p in expect, f"{self.describe(n)}: parent not indexed"
                assert self.depth[n] == self.depth[p] + 1, f"{self.describe(n)}: depth is not its parent's + 1"
                expect[p] += 1
            else:
                assert self.depth[n] == 0, f"{self.describe(n)}: a root node not at block 0"
        for tip in tips:
            assert tip in expect, f"tip {tip} not indexed"
            expect[tip] += 1
        for n in live:
            assert self.refs[n] == expect[n] and self.refs[n] > 0, f"{self.describe(n)}: expected refs {expect[n]}"
        free = set(self._free)
        assert len(free) == len(self._free), "a vacant node id listed twice"
        assert free.isdisjoint(expect) and len(free) + len(expect) == self.capacity, "node ids not conserved"
        for n in free:
            assert (self.refs[n], self.comp[n], self.swa[n], self.host_comp[n], self.host_swa[n], self.hits[n],
                    self.parent[n], self.key[n]) == (0, -1, -1, -1, -1, 0, -1, b""), f"dirty vacant {self.describe(n)}"

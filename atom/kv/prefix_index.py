"""The published prefixes, block by block: one verified chain that both pools' cached blocks hang on.

A node stands for one full block of tokens *under one exact prefix*: it records its parent node and
its own token key (the packed token ids), and is found by the chained block hash. A lookup walks from
block 0 and accepts a node only if its parent is the node accepted for the block before and its key
equals the query's, so a hash collision (even with a truncated hash) can never serve KV computed
under another prefix.

Each pool publishes at most one block per node (``node.comp`` / ``node.swa``: the block id, or -1);
the host tier keeps at most one copy of each per node (``node.host_comp`` / ``node.host_swa``: the host
page, or -1). A node lives while a block or host copy is published at it, a child node hangs on it, or
a request holds it as the tip of its published chain (``refs`` counts all four); the last release
removes it and walks up the chain.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["PrefixNode", "PrefixIndex"]


class PrefixNode:
    """One block of a published prefix; ``depth`` is its block index in the prompt."""

    __slots__ = ("block_hash", "parent", "key", "refs", "comp", "swa", "host_comp", "host_swa", "hits", "depth")

    def __init__(self, block_hash: int, parent: PrefixNode | None, key: bytes, depth: int) -> None:
        # one plain store per field (a tuple unpacking here costs about as much as the rest of the
        # body: a prompt's publication creates a node per block)
        self.block_hash = block_hash
        self.parent = parent
        self.key = key
        self.depth = depth
        self.refs = self.hits = 0  # hits: prefix hits that claimed this node's blocks (write-through)
        # the compressed / SWA block published here, and the host pages holding copies of them; -1: none
        self.comp = self.swa = self.host_comp = self.host_swa = -1

    def __repr__(self) -> str:
        return (f"PrefixNode({self.block_hash:#x}, depth={self.depth}, refs={self.refs}, comp={self.comp}, "
                f"swa={self.swa}, host_comp={self.host_comp}, host_swa={self.host_swa})")


class PrefixIndex:
    """Hash -> node, with exact parent and key checks on every lookup."""

    def __init__(self) -> None:
        self._nodes: dict[int, PrefixNode] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def chain(self, hashes: Sequence[int], keys: Sequence[bytes], limit: int) -> list[PrefixNode]:
        """The verified nodes of blocks ``0 .. k-1`` (k <= ``limit``), stopping at the first miss."""
        out: list[PrefixNode] = []
        nodes, parent = self._nodes, None
        for j in range(limit):
            node = nodes.get(hashes[j])
            if node is None or node.parent is not parent or node.key != keys[j]:
                break
            out.append(node)
            parent = node
        return out

    def extend(self, tip: PrefixNode | None, first: int, hashes: Sequence[int], keys: Sequence[bytes],
               end: int) -> list[PrefixNode]:
        """The nodes of blocks ``first .. end-1`` continuing the chain at ``tip`` (block ``first-1``'s
        node, None for block 0), created where absent. Stops early where a hash is taken by another
        prefix (those blocks stay private). Each new node takes a reference on its parent; the
        caller references what it publishes and moves its own tip."""
        out: list[PrefixNode] = []
        nodes, parent = self._nodes, tip
        for j in range(first, end):
            h = hashes[j]
            node = nodes.get(h)
            if node is None:
                node = nodes[h] = PrefixNode(h, parent, keys[j], j)
                if parent is not None:
                    parent.refs += 1
            elif node.parent is not parent or node.key != keys[j]:
                break
            out.append(node)
            parent = node
        return out

    def holds(self, node: PrefixNode) -> bool:
        """Whether ``node`` is indexed (alive)."""
        return self._nodes.get(node.block_hash) is node

    @staticmethod
    def ref(node: PrefixNode) -> None:
        node.refs += 1

    def unref(self, node: PrefixNode | None) -> None:
        """Drop one reference; unreferenced nodes are removed, walking up the chain."""
        nodes = self._nodes
        while node is not None:
            assert node.refs > 0, f"unref of unreferenced {node}"
            node.refs -= 1
            if node.refs:
                return
            del nodes[node.block_hash]
            node = node.parent

    def check_integrity(self, tips: Sequence[PrefixNode]) -> None:
        """refs == published blocks + host copies + children + holders' tips, for every node; all reachable."""
        expect = {id(n): (n.comp >= 0) + (n.swa >= 0) + (n.host_comp >= 0) + (n.host_swa >= 0)
                  for n in self._nodes.values()}
        for n in self._nodes.values():
            if n.parent is not None:
                assert self._nodes.get(n.parent.block_hash) is n.parent, f"{n}: parent not indexed"
                assert n.depth == n.parent.depth + 1, f"{n}: depth is not its parent's + 1"
                expect[id(n.parent)] += 1
            else:
                assert n.depth == 0, f"{n}: a root node not at block 0"
        for tip in tips:
            assert self._nodes.get(tip.block_hash) is tip, f"tip {tip} not indexed"
            expect[id(tip)] += 1
        for n in self._nodes.values():
            assert n.refs == expect[id(n)] and n.refs > 0, f"{n}: refs {n.refs}, expected {expect[id(n)]}"

"""Equal-size byte chunks and the per-owner page allocators that borrow them.

``ChunkArena`` knows only which chunks are free. ``ChunkBackedFreeList`` is one owner's page
allocator: it borrows whole chunks from the arena, cuts each into ``pages_per_chunk`` pages, and
returns a chunk only when every one of its pages is free again. A chunk therefore belongs to the
arena or to exactly one owner, which is what lets each owner lay out the chunk's bytes its own way
without ever aliasing another owner's data.

Page ids are physical: ``page = chunk * pages_per_chunk + local``. Each owner numbers its pages in
its own space (SWA pages and compressed pages are different units).

Every operation is O(1) in the number of chunks (O(pages_per_chunk) at worst, a small constant).
Misuse is loud: a double free, a free of a page whose chunk went back to the arena, or a free of a
page this owner never held raises :class:`ArenaError`; borrowing from an empty arena raises
:class:`ArenaEmpty`, which callers turn into eviction or preemption.
"""

from __future__ import annotations

from atom.validation import require_int
from atom.kv.int_runs import id_run

__all__ = ["ArenaEmpty", "ArenaError", "ChunkArena", "ChunkBackedFreeList"]


class ArenaEmpty(Exception):
    """Neither a free page in the owner's chunks nor a free chunk in the arena."""


class ArenaError(RuntimeError):
    """A page or chunk was used against the single-owner contract (a caller bug)."""


class ChunkArena:
    """The free chunks of one byte buffer. Free chunks are reused last-in first-out.

    Chunk ids start handed out in ascending order (0, 1, 2, ...), so a fresh arena fills from the
    front of the buffer.
    """

    def __init__(self, num_chunks: int) -> None:
        require_int("num_chunks", num_chunks, 0)
        self.num_chunks = num_chunks
        self._free: list[int] = list(range(num_chunks - 1, -1, -1))
        self._is_free = [True] * num_chunks

    def num_free(self) -> int:
        return len(self._free)

    def is_free(self, chunk: int) -> bool:
        return self._is_free[chunk]

    def acquire(self) -> int:
        """Take one free chunk; raises :class:`ArenaEmpty` if none is left."""
        if not self._free:
            raise ArenaEmpty(f"all {self.num_chunks} arena chunks are in use")
        chunk = self._free.pop()
        self._is_free[chunk] = False
        return chunk

    def acquire_many(self, n: int) -> list[int]:
        """Take ``n`` free chunks, the same ones in the same order as ``n`` calls of :meth:`acquire`;
        raises :class:`ArenaEmpty` (taking none) if fewer are free."""
        free = self._free
        if n > len(free):
            raise ArenaEmpty(f"{n} arena chunks wanted, {len(free)} of {self.num_chunks} free")
        out = free[-n:]
        del free[-n:]
        out.reverse()
        is_free = self._is_free
        for chunk in out:
            is_free[chunk] = False
        return out

    def release(self, chunk: int) -> None:
        """Give a chunk back. Releasing a free or unknown chunk raises :class:`ArenaError`."""
        if not 0 <= chunk < self.num_chunks:
            raise ArenaError(f"chunk {chunk} is outside the arena (0..{self.num_chunks - 1})")
        if self._is_free[chunk]:
            raise ArenaError(f"chunk {chunk} released twice")
        self._is_free[chunk] = True
        self._free.append(chunk)

    def release_many(self, chunks: list[int]) -> None:
        """:meth:`release` of each chunk, in order."""
        is_free, n = self._is_free, self.num_chunks
        for chunk in chunks:
            if not 0 <= chunk < n:
                raise ArenaError(f"chunk {chunk} is outside the arena (0..{n - 1})")
            if is_free[chunk]:
                raise ArenaError(f"chunk {chunk} released twice")
            is_free[chunk] = True
        self._free += chunks

    def check_integrity(self) -> None:
        assert len(set(self._free)) == len(self._free), "a chunk is on the free stack twice"
        assert sorted(self._free) == [c for c in range(self.num_chunks) if self._is_free[c]]


class ChunkBackedFreeList:
    """One owner's page allocator over borrowed chunks, packing pages into the fullest chunk.

    ``pop`` takes a free page from the owned chunk with the most pages in use (so lightly used
    chunks drain and can go back to the arena); only when no owned chunk has a free page does it
    borrow a new chunk. ``free`` returns the chunk to the arena once all its pages are free.

    Each owned chunk keeps its free pages as page ids (a stack, its lowest page on top when it is
    borrowed), so taking ``k`` pages of a chunk is one slice, with no id computed per page.
    """

    def __init__(self, arena: ChunkArena, pages_per_chunk: int, name: str) -> None:
        require_int("pages_per_chunk", pages_per_chunk, 1)
        self.arena = arena
        self.pages_per_chunk = pages_per_chunk
        self.name = name
        # chunk -> its free pages (a stack; the lowest page on top when the chunk is borrowed)
        self._free_pages: dict[int, list[int]] = {}
        # _by_used[u] = chunks with exactly u pages in use, 1 <= u < pages_per_chunk (dict = ordered set)
        self._by_used: list[dict[int, None]] = [{} for _ in range(pages_per_chunk)]
        self._num_used = 0

    # ---- queries ------------------------------------------------------------------------------
    def owned_chunks(self) -> list[int]:
        return list(self._free_pages)

    def owns_chunk(self, chunk: int) -> bool:
        return chunk in self._free_pages

    def num_used(self) -> int:
        return self._num_used

    def free_now(self) -> int:
        """Free pages inside chunks this owner already holds."""
        return len(self._free_pages) * self.pages_per_chunk - self._num_used

    def available(self) -> int:
        """Pages obtainable without evicting anything: own free pages + whole free chunks."""
        return self.free_now() + self.arena.num_free() * self.pages_per_chunk

    def chunks_needed(self, n: int) -> int:
        """Arena chunks that allocating ``n`` more pages would borrow."""
        ppc = self.pages_per_chunk
        short = n - len(self._free_pages) * ppc + self._num_used  # (free_now, inlined: a room check's hot path)
        return 0 if short <= 0 else -(-short // ppc)

    def used_in_chunk(self, chunk: int) -> int:
        return self.pages_per_chunk - len(self._free_pages[chunk])

    # ---- allocation ---------------------------------------------------------------------------
    def _borrow(self, chunk: int, taken: int) -> None:
        """Own fresh ``chunk`` whose first ``taken`` pages the caller takes."""
        ppc = self.pages_per_chunk
        base = chunk * ppc
        self._free_pages[chunk] = id_run(base + taken, base + ppc)[::-1]
        if taken < ppc:
            self._by_used[taken][chunk] = None

    def pop(self) -> int:
        """Allocate one page; raises :class:`ArenaEmpty` if neither a page nor a chunk is free. (The
        one-page rule that :meth:`pop_many` batches, kept written out as its reference.)"""
        for used in range(self.pages_per_chunk - 1, 0, -1):  # the fullest partial chunk, latest first
            bucket = self._by_used[used]
            if bucket:
                chunk = next(reversed(bucket))
                del bucket[chunk]
                if used + 1 < self.pages_per_chunk:
                    self._by_used[used + 1][chunk] = None
                self._num_used += 1
                return self._free_pages[chunk].pop()
        chunk = self.arena.acquire()
        self._borrow(chunk, 1)
        self._num_used += 1
        return chunk * self.pages_per_chunk

    def pop_many(self, n: int) -> list[int]:
        """``n`` pages, the same choice as ``n`` calls of one-page takes (fullest chunk first), taken
        a chunk at a time: first the partial chunks, then fresh chunks from the arena, each filled
        from its first page (a fresh chunk costs O(1) list operations, not one per page).
        :class:`ArenaEmpty` (taking none) when they do not fit: the room test is made here, inline,
        so that callers need no separate test (two calls more on every allocation)."""
        ppc, by_used, free_of = self.pages_per_chunk, self._by_used, self._free_pages
        short = n - len(free_of) * ppc + self._num_used  # (pages past this owner's free ones)
        if short > 0 and -(-short // ppc) > len(self.arena._free):
            raise ArenaEmpty(f"{self.name}: {n} pages wanted, {n - short} free in its chunks and "
                             f"{len(self.arena._free)} free chunks of {ppc} pages")
        self._num_used += n
        out: list[int] = []
        rest = n
        # partial chunks, fullest first (latest first in a bucket); empty buckets are skipped in C
        for bucket in filter(None, reversed(by_used)):
            while bucket:
                chunk = next(reversed(bucket))
                del bucket[chunk]
                free = free_of[chunk]
                have = len(free)
                if have > rest:  # (the last chunk taken from: it stays partial)
                    by_used[ppc - have + rest][chunk] = None
                    have = rest
                if have == 1:
                    out.append(free.pop())
                else:
                    taken = free[-have:]
                    del free[-have:]
                    taken.reverse()
                    out += taken
                rest -= have
                if not rest:
                    return out
        # fresh chunks, taken at once: every one but the last filled
        chunks = self.arena.acquire_many(-(-rest // ppc))
        last = chunks.pop()
        for chunk in chunks:
            base = chunk * ppc
            out += id_run(base, base + ppc)
            free_of[chunk] = []
        k = rest - len(chunks) * ppc
        base = last * ppc
        out += id_run(base, base + k)
        self._borrow(last, k)
        return out

    def free_many(self, pages: list[int]) -> None:
        """:meth:`free` of each page, grouped by chunk (each chunk's buckets move once)."""
        if len(pages) < 4:
            for page in pages:
                self.free(page)
            return
        ppc, by_chunk = self.pages_per_chunk, {}
        for page in pages:
            chunk = page // ppc
            members = by_chunk.get(chunk)
            if members is None:
                by_chunk[chunk] = [page]
            else:
                members.append(page)
        if len(set(pages)) != len(pages):
            raise ArenaError(f"{self.name}: a page freed twice in one call")
        free_of, by_used, emptied = self._free_pages, self._by_used, []
        for chunk, freed in by_chunk.items():
            free = free_of.get(chunk)
            if free is None:
                raise ArenaError(f"{self.name}: pages {freed} of chunk {chunk}, which this owner does not hold")
            if free and not set(free).isdisjoint(freed):  # (a full chunk has none free)
                raise ArenaError(f"{self.name}: a page of chunk {chunk} freed twice")
            used = ppc - len(free)
            if used < ppc:
                del by_used[used][chunk]
            free += freed
            used -= len(freed)
            if used == 0:
                del free_of[chunk]
                emptied.append(chunk)
            else:
                by_used[used][chunk] = None
        self._num_used -= len(pages)
        if emptied:  # back to the arena in the order they emptied
            self.arena.release_many(emptied)

    def free(self, page: int) -> None:
        """Return one page; the chunk goes back to the arena when all its pages are free."""
        ppc, by_used = self.pages_per_chunk, self._by_used
        chunk = page // ppc
        free = self._free_pages.get(chunk)
        if free is None:
            raise ArenaError(
                f"{self.name}: page {page} is in chunk {chunk}, which this owner does not hold "
                "(already returned to the arena, or never borrowed)")
        if page in free:
            raise ArenaError(f"{self.name}: page {page} freed twice")
        used = ppc - len(free)
        if used < ppc:
            del by_used[used][chunk]
        free.append(page)
        self._num_used -= 1
        if used == 1:
            del self._free_pages[chunk]
            self.arena.release(chunk)
        else:
            by_used[used - 1][chunk] = None

    def check_integrity(self) -> None:
        used = 0
        for chunk, free in self._free_pages.items():
            assert not self.arena.is_free(chunk), f"{self.name}: owns chunk {chunk} that the arena calls free"
            assert len(set(free)) == len(free), f"{self.name}: chunk {chunk} lists a page twice"
            assert all(p // self.pages_per_chunk == chunk for p in free), f"{self.name}: chunk {chunk} lists another's page"
            n_used = self.pages_per_chunk - len(free)
            assert 1 <= n_used <= self.pages_per_chunk, f"{self.name}: owns fully free chunk {chunk}"
            in_bucket = [u for u, b in enumerate(self._by_used) if chunk in b]
            expect = [] if n_used == self.pages_per_chunk else [n_used]
            assert in_bucket == expect, f"{self.name}: chunk {chunk} in buckets {in_bucket}, expected {expect}"
            used += n_used
        assert used == self._num_used, f"{self.name}: used count {self._num_used} != {used}"

"""A model of ``DeviceCachingAllocator`` (PyTorch ``c10/cuda/CUDACachingAllocator.cpp``).

One instance models one device: per-stream small and large pools of cached free blocks,
best-fit reuse, splitting and merging, ``max_split_size``, expandable segments and the
release-and-retry sequence on a failed device allocation. Source version and line-number
conventions: see :mod:`vramlens.allocator._blocks`. Bytes are ``int`` everywhere.

Modeled as the source does, with these deliberate simplifications: no CUDA graph private pools,
no ``recordStream`` events (a freed block is reusable at once), no garbage collection
(``garbage_collection_threshold`` only acts under ``set_per_process_memory_fraction``), no
``empty_cache`` calls. ``capacity`` stands for the device memory that cudaMalloc / cuMemCreate
can hand out: a new segment (or mapped page run) fails when it would take ``reserved`` above it.
"""

from __future__ import annotations

from vramlens.allocator._blocks import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    SIZE_MAX,
    UNLIMITED_DEVICE_BYTES,
    Block,
    ExpandableSegment,
    Pool,
    allocation_size,
    round_request,
    splice,
)


class CachingAllocatorModel:
    """State of one device's caching allocator; ``malloc`` / ``free`` mirror the source's.

    ``allocated`` is the ``allocated_bytes`` stat (sum of the sizes of allocated blocks, which
    can exceed the rounded request when a block is not split); ``reserved`` is ``reserved_bytes``
    (cudaMalloc'd segments plus mapped pages of expandable segments).
    """

    def __init__(
        self,
        *,
        divisions_by_interval: tuple[int, ...],
        max_split_size: int | None = None,
        max_non_split_rounding: int = K_LARGE_BUFFER,
        expandable: bool = False,
        capacity: int | None = None,
    ) -> None:
        self.allocated = 0
        self.reserved = 0
        self.segments_created = 0
        self._divisions = divisions_by_interval
        self._max_split = SIZE_MAX if max_split_size is None else max_split_size
        self._non_split_rounding = max_non_split_rounding
        self._expandable = expandable
        self._capacity = capacity
        device = UNLIMITED_DEVICE_BYTES if capacity is None else capacity
        self._address_space = device + device // 8  # ExpandableSegment: 1 1/8 of totalGlobalMem
        self._pools: dict[int, Pool] = {}
        self._next_address = K_LARGE_BUFFER
        self._rounded: dict[int, int] = {}

    def state_key(self) -> tuple[object, ...]:
        """A value that is equal for two states of this model (with the same blocks allocated) only
        when every later sequence of requests behaves the same from both: the segments (reserved
        bytes and the next segment's address) and each pool's free blocks and unmapped ranges, by
        size and address. Blocks are not compared as objects: a segment is partitioned into its
        allocated blocks, its free blocks and (expandable) its unmapped ranges."""
        return (
            self.reserved,
            self._next_address,
            tuple(
                (index, tuple(pool.keys), tuple((block.addr, block.size) for block in pool.unmapped))
                for index, pool in self._pools.items()
            ),
        )

    def pools(self) -> list[Pool]:
        """All pools created so far, large pools first (the order ``release_cached_blocks`` uses)."""
        return sorted(self._pools.values(), key=lambda pool: (pool.small, pool.stream))

    def malloc(self, nbytes: int, stream: int) -> Block | None:
        """Allocate ``nbytes`` (> 0) on ``stream``; None is an out-of-memory error.

        Follows ``DeviceCachingAllocator::malloc`` (~L1420-L1600): round, pick the pool, reuse a
        cached block (``get_free_block``) or get a new one (``alloc_block``), on failure release
        cached oversize blocks then all unused segments and retry, then split.
        """
        size = self._rounded.get(nbytes)
        if size is None:
            size = self._rounded[nbytes] = round_request(nbytes, self._divisions)
        small = size <= K_SMALL_SIZE
        pool = self._pools.get(2 * stream + small)
        if pool is None:
            pool = self._pools[2 * stream + small] = Pool(small, stream)
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, size)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, size)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, size)
            if block is None:
                return None
        return self._alloc_found_block(pool, block, size)

    def free(self, block: Block) -> None:
        """Return an allocated block to its pool, merging free neighbours.

        Follows ``free`` and ``free_block`` / ``try_merge_blocks`` (~L3015-L3110): a neighbour
        merges when it is neither allocated nor in a different mapped state.
        """
        self.allocated -= block.size
        block.allocated = False
        pool = block.pool
        prev = block.prev
        if prev is not None and not prev.allocated and prev.mapped:
            pool.remove(prev)
            block.addr = prev.addr
            block.size += prev.size
            splice(block, prev.prev, block.next)
        after = block.next
        if after is not None and not after.allocated and after.mapped:
            pool.remove(after)
            block.size += after.size
            splice(block, block.prev, after.next)
        pool.insert(block)

    def _get_free_block(self, pool: Pool, size: int) -> Block | None:
        """Best fit in the pool, or None: ``get_free_block`` (~L3168).

        The smallest cached block of at least ``size`` bytes (lowest address on ties). An
        oversize block (>= max_split_size) serves only a request that is itself >= max_split_size
        and smaller than the block by less than ``max_non_split_rounding_size``.
        """
        index = pool.lower_bound(size)
        blocks = pool.blocks
        if index == len(blocks):
            return None
        if self._expandable:
            index = _prefer_growable(blocks, index)
        block = blocks[index]
        if size < self._max_split <= block.size:
            return None
        if size >= self._max_split and block.size >= size + self._non_split_rounding:
            return None
        del pool.keys[index]
        del blocks[index]
        return block

    def _should_split(self, pool: Pool, block: Block, size: int) -> bool:
        """``should_split`` (~L3140): small pool and expandable segments split when at least 512 B
        remain; the large pool only for requests below max_split_size leaving more than 1 MiB."""
        remaining = block.size - size
        if pool.small or self._expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, pool: Pool, block: Block, size: int) -> Block:
        """Split off the front ``size`` bytes when ``should_split`` says so: ``alloc_found_block``
        (~L1620). The allocated stat grows by the size of the block handed out."""
        if self._should_split(pool, block, size):
            head = Block(block.addr, size, pool, block.segment)
            splice(head, block.prev, block)
            block.addr += size
            block.size -= size
            pool.insert(block)
            block = head
        block.allocated = True
        self.allocated += block.size
        return block

    def _alloc_block(self, pool: Pool, size: int) -> Block | None:
        """A new segment for a rounded request, or None when the device is full: ``alloc_block``
        (~L3303). Expandable segments map pages instead of calling cudaMalloc."""
        if self._expandable:
            return self._try_allocate_expandable_block(pool, size)
        nbytes = allocation_size(size)
        if self._capacity is not None and self.reserved + nbytes > self._capacity:
            return None
        block = Block(self._next_address, nbytes, pool, None)
        self._next_address += nbytes
        self.reserved += nbytes
        self.segments_created += 1
        return block

    def _release_block(self, block: Block) -> None:
        """cudaFree a whole cached segment: ``release_block`` (~L3508)."""
        block.pool.remove(block)
        self.reserved -= block.size

    def _release_available_cached_blocks(self, pool: Pool, size: int) -> bool:
        """Free cached oversize segments of this pool, just enough for the request:
        ``release_available_cached_blocks`` (~L3392).

        Only with max_split_size set. Frees the smallest cached block of at least
        max(size, max_split_size) bytes; failing that, frees oversize blocks from the largest
        down until as many bytes are released (kept freed even when that is not enough).
        """
        if self._max_split == SIZE_MAX:
            return False
        target = max(size, self._max_split)
        index = pool.lower_bound(target)
        blocks = pool.blocks
        if index < len(blocks) and blocks[index].segment is None:
            self._release_block(blocks[index])
            return True
        released = 0
        while index > 0 and released < target and blocks[index - 1].size >= self._max_split:
            index -= 1
            if blocks[index].segment is None:
                released += blocks[index].size
                self._release_block(blocks[index])
        return released >= target

    def _release_cached_blocks(self) -> None:
        """Free every cached segment that is not split and unmap every free page of expandable
        segments, large pools first: ``release_cached_blocks`` / ``release_blocks`` (~L3447,
        ~L3666). A fully unmapped expandable segment is dropped (``release_expandable_segment``)."""
        for pool in self.pools():
            to_unmap: list[Block] = []
            for block in list(pool.blocks):
                if block.segment is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self._release_block(block)
            for block in to_unmap:
                self._unmap_block(block)
                if block.prev is None and block.next is None and not block.mapped:
                    pool.remove_unmapped(block)

    def _try_allocate_expandable_block(self, pool: Pool, size: int) -> Block | None:
        """Map enough pages at the lowest usable address: ``try_allocate_expandable_block``
        (~L2985). Returns the (free, out-of-pool) block that now holds at least ``size`` bytes."""
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            if following is None or following.mapped:
                return None
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: Pool, size: int) -> Block:
        """Lowest-address run of free and unmapped blocks holding ``size`` bytes, else a new
        expandable segment: ``find_expandable_block`` (~L2875)."""
        for unmapped in pool.unmapped:
            start = unmapped
            if start.prev is not None and not start.prev.allocated:
                start = start.prev
            room = 0
            room_block: Block | None = start
            while room < size and room_block is not None and not room_block.allocated:
                room += room_block.size
                room_block = room_block.next
            if room >= size:
                return start
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        segment = ExpandableSegment(self._next_address, page)
        pages = -(-self._address_space // page)
        block = Block(self._next_address, pages * page, pool, segment)
        block.mapped = False
        self._next_address += pages * page
        self.segments_created += 1
        pool.insert_unmapped(block)
        return block

    def _map_block(self, block: Block, size: int) -> bool:
        """Map whole pages for the first ``size`` bytes of an unmapped block: ``map_block``
        (~L2925) and ``ExpandableSegment::map`` (~L450). False when the device is full."""
        segment = block.segment
        assert segment is not None
        mapped = -(-size // segment.page) * segment.page
        if self._capacity is not None and self.reserved + mapped > self._capacity:
            return False
        pool = block.pool
        pool.remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, pool, segment)
            rest.mapped = False
            splice(rest, block, block.next)
            pool.insert_unmapped(rest)
            block.size = mapped
        _merge_neighbours(block, mapped=True)
        pool.insert(block)
        self.reserved += mapped
        return True

    def _unmap_block(self, block: Block) -> None:
        """Unmap the whole pages inside a free expandable block: ``unmap_block`` (~L3555) and
        ``ExpandableSegment::unmap`` (~L550). Partial pages at either end stay mapped and free."""
        segment = block.segment
        assert segment is not None
        page, base = segment.page, segment.base
        begin = base - (-(block.addr - base) // page) * page
        end = base + (block.addr + block.size - base) // page * page
        if begin >= end:
            return
        pool = block.pool
        pool.remove(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, pool, segment)
            splice(before, block.prev, block)
            pool.insert(before)
        if end < block.addr + block.size:
            after = Block(end, block.addr + block.size - end, pool, segment)
            splice(after, block, block.next)
            pool.insert(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        _merge_neighbours(block, mapped=False)
        pool.insert_unmapped(block)
        self.reserved -= end - begin


def _prefer_growable(blocks: list[Block], index: int) -> int:
    """With expandable segments, best fit counts the unmapped space right after a free block as
    part of it, so a later block whose growable size is smaller wins (``get_free_block``)."""

    def growable(block: Block) -> int:
        after = block.next
        return block.size + (after.size if after is not None and not after.mapped else 0)

    while index + 1 < len(blocks) and growable(blocks[index + 1]) < growable(blocks[index]):
        index += 1
    return index


def _merge_neighbours(block: Block, *, mapped: bool) -> None:
    """Absorb free neighbours in the same mapped state into ``block`` (``try_merge_blocks``),
    taking them out of the pool's free or unmapped set."""
    prev = block.prev
    if prev is not None and not prev.allocated and prev.mapped is mapped:
        (block.pool.remove if mapped else block.pool.remove_unmapped)(prev)
        block.addr = prev.addr
        block.size += prev.size
        splice(block, prev.prev, block.next)
    after = block.next
    if after is not None and not after.allocated and after.mapped is mapped:
        (block.pool.remove if mapped else block.pool.remove_unmapped)(after)
        block.size += after.size
        splice(block, block.prev, after.next)

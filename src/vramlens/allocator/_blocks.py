"""Constants, size rounding, blocks and free-block pools of the CUDA caching allocator model.

Source read: PyTorch ``c10/cuda/CUDACachingAllocator.cpp`` on ``main`` as of late 2025 (the
version whose ``get_free_block`` reads ``AcceleratorAllocatorConfig::max_non_split_rounding_size``
and whose ``malloc`` calls ``try_mempool_fallback``; about 4,650 lines) and
``c10/core/AllocatorConfig.{h,cpp}`` of the same period. Line numbers below are approximate
(estimated from character offsets in the file as read, within about 50 lines). The logic used
here is the same in ``pytorch/pytorch@001074d25084fdb87a799823e395a50f5ec044d3`` (2.4 era:
``CUDAAllocatorConfig`` instead of ``AcceleratorAllocatorConfig``, the constant ``kLargeBuffer``
where ``max_non_split_rounding_size`` (default: kLargeBuffer) now is).
No code was copied; only the behavior is modeled. All sizes are bytes (``int``).
"""

from __future__ import annotations

from bisect import bisect_left, insort

# name                     value         where the number comes from
K_MIN_BLOCK_SIZE = 512  # CUDACachingAllocator.cpp kMinBlockSize: every size is rounded to 512 B
K_SMALL_SIZE = 1 << 20  # CUDACachingAllocator.cpp kSmallSize: largest "small" request, 1 MiB
K_SMALL_BUFFER = 2 << 20  # CUDACachingAllocator.cpp / CachingDeviceAllocator.h kSmallBuffer: 2 MiB
K_MIN_LARGE_ALLOC = 10 << 20  # CUDACachingAllocator.cpp kMinLargeAlloc: 10 MiB
K_LARGE_BUFFER = 20 << 20  # c10/core/AllocatorConfig.h kLargeBuffer: 20 MiB (large_segment_size default)
K_ROUND_LARGE = 2 << 20  # CUDACachingAllocator.cpp kRoundLarge: large segments rounded to 2 MiB
SIZE_MAX = (1 << 64) - 1  # AllocatorConfig max_split_size_ default: std::numeric_limits<size_t>::max()
ROUNDUP_INTERVALS = 16  # AllocatorConfig.cpp kRoundUpPowerOfTwoIntervals (1 MiB .. 64 GiB)
ROUNDUP_FIRST_LOG2 = 20  # AllocatorConfig.cpp kRoundUpPowerOfTwoStart = 1 MiB
#: Notional device size (bytes) used only to size the virtual address range of an expandable
#: segment when no capacity is given (ExpandableSegment reserves 1 1/8 of totalGlobalMem).
UNLIMITED_DEVICE_BYTES = 1 << 50
#: Free blocks sort by (size, address) as BlockComparatorSize does within one stream; both are
#: packed into one int, ``size << KEY_SHIFT | address``, so that ``bisect`` compares plain ints.
KEY_SHIFT = 96


def interval_index(size: int) -> int:
    """Index of ``size`` (bytes) in the 16 power-of-two intervals of ``roundup_power2_divisions``.

    Follows ``AcceleratorAllocatorConfig::roundup_power2_divisions(size)`` (AllocatorConfig.cpp
    ~L40): floor(log2(size)) - 20, clamped to [0, 15]; index 0 holds everything below 2 MiB.
    """
    index = max(0, size.bit_length() - 1 - ROUNDUP_FIRST_LOG2)
    return min(index, ROUNDUP_INTERVALS - 1)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` (bytes) up to the next of ``divisions`` equal steps between two powers of two.

    Follows ``roundup_power2_next_division`` (CUDACachingAllocator.cpp ~L2645): 1200 with 4
    divisions lies in [1024, 2048) whose steps are 1024, 1280, 1536, 1792, so it gives 1280.
    """
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    down = size & ~(step - 1)
    return size if down == size else down + step


def round_request(nbytes: int, divisions_by_interval: tuple[int, ...]) -> int:
    """The allocator's ``round_size`` (CUDACachingAllocator.cpp ~L2672) of a request of ``nbytes``.

    Below 512 B: 512. With more than one division configured for the size's interval and the
    size above ``512 * divisions``: the power-of-two division; otherwise the next multiple of 512.
    """
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = divisions_by_interval[interval_index(nbytes)]
    if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(nbytes, divisions)
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """Bytes of the segment cudaMalloc'd for a rounded request: ``get_allocation_size`` (~L3160).

    Small requests (<= 1 MiB) get a 2 MiB segment, requests below 10 MiB a 20 MiB one, larger
    requests their size rounded up to a multiple of 2 MiB.
    """
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class ExpandableSegment:
    """Virtual address range mapped page by page: ``struct ExpandableSegment`` (~L410-L830).

    ``page`` is the segment_size_ of the source: 2 MiB for the small pool, 20 MiB
    (``large_segment_size``) for the large pool (``find_expandable_block``, ~L2875).
    """

    __slots__ = ("base", "page")

    base: int
    page: int

    def __init__(self, base: int, page: int) -> None:
        self.base = base
        self.page = page


class Block:
    """A contiguous range of one segment: free, allocated, or (expandable only) unmapped.

    Mirrors ``struct Block``: ``prev``/``next`` link the blocks of one segment in address order;
    a block with neither is a whole segment. ``key`` caches the pool sort key while the block
    sits in a pool.
    """

    __slots__ = ("addr", "allocated", "key", "mapped", "next", "pool", "prev", "segment", "size")

    addr: int
    size: int
    pool: Pool
    segment: ExpandableSegment | None
    prev: Block | None
    next: Block | None
    allocated: bool
    mapped: bool
    key: int

    def __init__(self, addr: int, size: int, pool: Pool, segment: ExpandableSegment | None) -> None:
        self.addr = addr
        self.size = size
        self.pool = pool
        self.segment = segment
        self.prev = None
        self.next = None
        self.allocated = False
        self.mapped = True
        self.key = 0


def splice(block: Block, before: Block | None, after: Block | None) -> None:
    """Link ``block`` between ``before`` and ``after`` (``Block::splice``)."""
    if before is not None:
        before.next = block
    block.prev = before
    if after is not None:
        after.prev = block
    block.next = after


class Pool:
    """Free blocks of one (small/large, stream) pair: ``struct BlockPool`` for a single stream.

    ``blocks`` is the size-ordered free set (BlockComparatorSize: stream, size, address; one
    pool per stream makes the stream test implicit) kept as two parallel sorted lists;
    ``unmapped`` is the address-ordered set of unmapped ranges of expandable segments.
    """

    __slots__ = ("blocks", "keys", "small", "stream", "unmapped", "unmapped_addrs")

    small: bool
    stream: int
    keys: list[int]
    blocks: list[Block]
    unmapped_addrs: list[int]
    unmapped: list[Block]

    def __init__(self, small: bool, stream: int) -> None:
        self.small = small
        self.stream = stream
        self.keys = []
        self.blocks = []
        self.unmapped_addrs = []
        self.unmapped = []

    def insert(self, block: Block) -> None:
        """Add a free mapped block (``BlockPool::insert_into_blocks``)."""
        key = (block.size << KEY_SHIFT) | block.addr
        block.key = key
        index = bisect_left(self.keys, key)
        self.keys.insert(index, key)
        self.blocks.insert(index, block)

    def remove(self, block: Block) -> None:
        """Take a free mapped block out of the pool."""
        index = bisect_left(self.keys, block.key)
        del self.keys[index]
        del self.blocks[index]

    def lower_bound(self, size: int) -> int:
        """Index of the smallest free block of at least ``size`` bytes (lowest address on ties)."""
        return bisect_left(self.keys, size << KEY_SHIFT)

    def insert_unmapped(self, block: Block) -> None:
        """Add an unmapped range (``BlockPool::unmapped``, BlockComparatorAddress order)."""
        index = bisect_left(self.unmapped_addrs, block.addr)
        self.unmapped_addrs.insert(index, block.addr)
        self.unmapped.insert(index, block)

    def remove_unmapped(self, block: Block) -> None:
        """Take an unmapped range out of the pool."""
        index = bisect_left(self.unmapped_addrs, block.addr)
        del self.unmapped_addrs[index]
        del self.unmapped[index]


def cache_free_block(
    block: tuple[int, int, list[int]], free_start: dict[int, int], free_end: dict[int, int], starts: set[int]
) -> None:
    """``free_block`` of the fixed-segment replays: merge the free neighbours of ``block`` (address,
    bytes, its pool of ``size << KEY_SHIFT | address`` keys) within its segment (``starts``: the
    segments' first addresses), then cache it. Shared by
    :meth:`~vramlens.allocator.replaying.FixedSegmentReplay.free` and the written-out loop of
    :mod:`vramlens.allocator._fixed_loop`."""
    address, size, pool = block
    before = None if address in starts else free_end.get(address)
    if before is not None:
        merged = free_start.pop(before)
        del free_end[address]
        del pool[bisect_left(pool, merged << KEY_SHIFT | before)]
        address, size = before, size + merged
    end = address + size
    after = None if end in starts else free_start.get(end)
    if after is not None:
        del free_start[end]
        del free_end[end + after]
        del pool[bisect_left(pool, after << KEY_SHIFT | end)]
        size += after
        end += after
    free_start[address] = size
    free_end[end] = address
    insort(pool, size << KEY_SHIFT | address)

"""Caching-allocator replay: hand-computed segment layouts (each with its arithmetic), settings
and their parsing, input errors, and properties of random timelines.

Numbers follow PyTorch's ``CUDACachingAllocator.cpp``: 512 B rounding, small pool <= 1 MiB in
2 MiB segments, requests < 10 MiB in 20 MiB segments, larger ones rounded up to 2 MiB; a large
block is split only when more than 1 MiB would remain.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.allocator import AllocatorSettings, ReplayResult, replay, round_size, segment_size
from vramlens.allocator._blocks import Block
from vramlens.allocator._caching import CachingAllocatorModel

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def run(events: list[tuple[int, int]], streams: list[int] | None = None, **options: Any) -> ReplayResult:
    """Replay (size, key) events; a negative size frees the key."""
    sizes = np.array([size for size, _ in events], dtype=np.int64)
    keys = np.array([key for _, key in events], dtype=np.int64)
    stream_array = None if streams is None else np.array(streams, dtype=np.int32)
    return replay(sizes, keys, stream_array, AllocatorSettings(**options))


def trace(result: ReplayResult) -> list[tuple[int, int]]:
    """(allocated, reserved) after each event, in bytes."""
    return list(zip(result.allocated_bytes.tolist(), result.reserved_bytes.tolist(), strict=True))


# --- segment sizes and rounding -------------------------------------------------------------


def test_one_byte_takes_512_bytes_of_a_2_mib_small_segment() -> None:
    # 1 B -> round_size 512 B; small pool (<= 1 MiB) -> new 2 MiB segment, split (2 MiB - 512 >= 512)
    result = run([(1, 1)])
    assert trace(result) == [(512, 2 * MiB)]
    assert result.segments_created == 1
    # slack at the peak: 2 MiB - 512 = 2_096_640 B
    assert result.fragmentation_bytes == 2_096_640
    assert result.fragmentation == pytest.approx(2_096_640 / 2_097_152)


def test_two_600_kib_requests_share_one_small_segment() -> None:
    # 600 KiB = 614_400 B = 1200 * 512 (already rounded); 2 * 614_400 = 1_228_800 < 2 MiB
    result = run([(600 * KiB, 1), (600 * KiB, 2)])
    assert trace(result) == [(614_400, 2 * MiB), (1_228_800, 2 * MiB)]
    assert result.segments_created == 1


def test_exactly_1_mib_is_small_and_1_mib_plus_1_is_large() -> None:
    # 1 MiB <= kSmallSize -> small pool, 2 MiB segment
    assert trace(run([(MiB, 1)])) == [(MiB, 2 * MiB)]
    # 1 MiB + 1 -> 1_049_088 (next multiple of 512) -> large pool, < 10 MiB -> 20 MiB segment;
    # remaining 20_971_520 - 1_049_088 = 19_922_432 > 1 MiB -> split, allocated = 1_049_088
    assert trace(run([(MiB + 1, 1)])) == [(1_049_088, 20 * MiB)]


def test_requests_of_10_mib_and_more_get_segments_rounded_to_2_mib() -> None:
    # 12 MiB = 12_582_912 B: >= kMinLargeAlloc -> 12 MiB segment, nothing remains
    assert trace(run([(12 * MiB, 1)])) == [(12 * MiB, 12 * MiB)]
    # 22 MiB + 1 -> 23_069_184 (512-rounded) -> segment 24 MiB = 25_165_824;
    # remaining 2_096_640 > 1 MiB -> split, allocated 23_069_184
    assert trace(run([(22 * MiB + 1, 1)])) == [(23_069_184, 24 * MiB)]


def test_large_block_with_at_most_1_mib_left_is_not_split_and_counts_whole() -> None:
    # 25 MiB + 1 -> 26_214_912 -> segment 26 MiB = 27_262_976; remaining 1_048_064 <= 1 MiB
    # -> not split; the allocated stat adds block->size, the whole 26 MiB
    assert trace(run([(25 * MiB + 1, 1)])) == [(26 * MiB, 26 * MiB)]
    # 19.5 MiB = 20_447_232 -> segment 20 MiB; remaining 512 KiB -> not split -> 20 MiB allocated
    assert trace(run([(20_447_232, 1)])) == [(20 * MiB, 20 * MiB)]


def test_round_size_and_segment_size_by_hand() -> None:
    assert [round_size(n) for n in (0, 1, 512, 513, 4600)] == [512, 512, 512, 1024, 4608]
    # segment: 2 MiB up to 1 MiB, 20 MiB below 10 MiB, else rounded up to 2 MiB
    sizes = (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 25 * MiB + 512)
    assert [segment_size(n) for n in sizes] == [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 26 * MiB]
    with pytest.raises(ValueError, match="nbytes"):
        round_size(-1)
    with pytest.raises(ValueError, match="rounded"):
        segment_size(0)


def test_roundup_power2_divisions() -> None:
    four = AllocatorSettings(roundup_power2_divisions=4)
    # 1200 MiB in [1024, 2048) MiB, 4 steps of 256 MiB: 1024, 1280, 1536, 1792 -> 1280 MiB
    assert round_size(1200 * MiB, four) == 1280 * MiB
    # 4600 B > 512 * 4: in [4096, 8192) with steps of 1024 -> 5120 (plain rounding: 4608)
    assert round_size(4600, four) == 5120
    # 1200 B <= 512 * 4 = 2048 -> plain 512 rounding: 1536; powers of two stay as they are
    assert (round_size(1200, four), round_size(GiB, four)) == (1536, GiB)
    # the replay reserves the rounded size: 1280 MiB is a multiple of 2 MiB
    assert trace(run([(1200 * MiB, 1)], roundup_power2_divisions=4)) == [(1280 * MiB, 1280 * MiB)]


def test_roundup_power2_divisions_per_interval() -> None:
    conf = AllocatorSettings.from_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    # [256, 512) MiB and below: 1 division (off); [512, 1024) MiB: 2; from 1 GiB: 4
    assert round_size(300 * MiB, conf) == 300 * MiB
    # 600 MiB: steps of 512 / 2 = 256 MiB -> 768 MiB
    assert round_size(600 * MiB, conf) == 768 * MiB
    assert round_size(1200 * MiB, conf) == 1280 * MiB


# --- reuse, best fit, split and merge -------------------------------------------------------


def test_freed_block_is_reused_without_a_new_segment() -> None:
    result = run([(12 * MiB, 1), (-12 * MiB, 1), (12 * MiB, 2)])
    assert trace(result) == [(12 * MiB, 12 * MiB), (0, 12 * MiB), (12 * MiB, 12 * MiB)]
    assert (result.segments_created, result.peak_index, result.fragmentation_bytes) == (1, 0, 0)


def test_best_fit_picks_the_smallest_block_that_fits() -> None:
    # segments of 12 and 16 MiB, both freed. 11 MiB takes the 12 MiB block (1 MiB left: not
    # split, allocated 12 MiB); 16 MiB then takes the 16 MiB block: still 28 MiB reserved.
    events = [(12 * MiB, 1), (16 * MiB, 2), (-12 * MiB, 1), (-16 * MiB, 2), (11 * MiB, 3), (16 * MiB, 4)]
    result = run(events)
    assert trace(result)[-2:] == [(12 * MiB, 28 * MiB), (28 * MiB, 28 * MiB)]
    assert result.segments_created == 2


def test_adjacent_free_blocks_merge() -> None:
    # 4 MiB -> 20 MiB segment [X 4 | free 16]; 4 MiB -> [X | Y 4 | free 12]; 12 MiB takes the
    # 12 MiB block exactly. Freeing X then Y merges them into one 8 MiB block, which holds a
    # new 8 MiB request (without merging it would need a second 20 MiB segment).
    events = [(4 * MiB, 1), (4 * MiB, 2), (12 * MiB, 3), (-4 * MiB, 1), (-4 * MiB, 2), (8 * MiB, 4)]
    result = run(events)
    allocated = [4 * MiB, 8 * MiB, 20 * MiB, 16 * MiB, 12 * MiB, 20 * MiB]
    assert trace(result) == [(a, 20 * MiB) for a in allocated]
    assert result.segments_created == 1


def test_streams_do_not_share_cached_blocks() -> None:
    events = [(12 * MiB, 1), (-12 * MiB, 1), (12 * MiB, 2)]
    # stream 1 cannot use stream 0's cached 12 MiB block: 12 + 12 = 24 MiB reserved
    assert run(events, streams=[0, 0, 1]).peak_reserved_bytes == 24 * MiB
    assert run(events, streams=[0, 0, 0]).peak_reserved_bytes == 12 * MiB
    # small pool too: two 2 MiB segments
    assert run([(1, 1), (-1, 1), (1, 2)], streams=[0, 0, 7]).peak_reserved_bytes == 4 * MiB


# --- max_split_size -------------------------------------------------------------------------


def test_oversize_cached_block_is_not_used_for_a_smaller_request() -> None:
    # max_split 32 MiB: the cached 40 MiB block is oversize and 12 MiB < 32 MiB -> new 12 MiB
    # segment: 40 + 12 = 52 MiB reserved
    result = run([(40 * MiB, 1), (-40 * MiB, 1), (12 * MiB, 2)], max_split_size_bytes=32 * MiB)
    assert trace(result)[-1] == (12 * MiB, 52 * MiB)


def test_oversize_block_serves_a_large_request_whole_within_the_rounding_limit() -> None:
    events = [(40 * MiB, 1), (-40 * MiB, 1), (36 * MiB, 2)]
    # 36 MiB >= max_split and 40 < 36 + 20 -> reused, not split: allocated 40 MiB
    assert trace(run(events, max_split_size_bytes=32 * MiB))[-1] == (40 * MiB, 40 * MiB)
    # without max_split_size the 40 MiB block is split (4 MiB > 1 MiB remain): 36 MiB
    assert trace(run(events))[-1] == (36 * MiB, 40 * MiB)
    # 60 MiB >= 33 + 20 -> too big: new segment of 33 MiB rounded to 34 MiB -> 94 MiB
    far = [(60 * MiB, 1), (-60 * MiB, 1), (33 * MiB, 2)]
    assert trace(run(far, max_split_size_bytes=32 * MiB))[-1] == (34 * MiB, 94 * MiB)
    # max_non_split_rounding 40 MiB: 60 < 33 + 40 -> reused whole
    wide = AllocatorSettings.from_conf("max_split_size_mb:32,max_non_split_rounding_mb:40")
    sizes, keys = np.array([s for s, _ in far]), np.array([k for _, k in far])
    assert trace(replay(sizes, keys, settings=wide))[-1] == (60 * MiB, 60 * MiB)


# --- expandable segments --------------------------------------------------------------------


def test_expandable_segment_grows_in_20_mib_pages_and_reuses_its_tail() -> None:
    events = [(30 * MiB, 1), (-30 * MiB, 1), (32 * MiB, 2)]
    # 30 MiB maps ceil(30 / 20) = 2 pages = 40 MiB; freed, the 40 MiB range holds 32 MiB
    result = run(events, expandable_segments=True)
    assert trace(result) == [(30 * MiB, 40 * MiB), (0, 40 * MiB), (32 * MiB, 40 * MiB)]
    assert result.segments_created == 1
    # cudaMalloc segments: 30 MiB, then a new 32 MiB one: 62 MiB
    assert trace(run(events))[-1] == (32 * MiB, 62 * MiB)


def test_expandable_segment_maps_whole_pages() -> None:
    # small pool page is 2 MiB; a large request maps whole 20 MiB pages: 12 MiB -> 20 MiB, a
    # second 12 MiB uses the 8 MiB left and one more page -> 40 MiB (cudaMalloc: 24 MiB)
    assert trace(run([(1, 1)], expandable_segments=True)) == [(512, 2 * MiB)]
    result = run([(12 * MiB, 1), (12 * MiB, 2)], expandable_segments=True)
    assert trace(result) == [(12 * MiB, 20 * MiB), (24 * MiB, 40 * MiB)]
    # the request is split at 512 B granularity: 25 MiB + 1 counts 26_214_912, not 26 MiB
    assert trace(run([(25 * MiB + 1, 1)], expandable_segments=True)) == [(26_214_912, 40 * MiB)]


# --- capacity -------------------------------------------------------------------------------


def test_capacity_pressure_frees_cached_segments_then_reports_oom() -> None:
    events = [(12 * MiB, 1), (12 * MiB, 2), (-12 * MiB, 1), (-12 * MiB, 2), (30 * MiB, 3), (12 * MiB, 4)]
    events += [(-12 * MiB, 4), (-30 * MiB, 3)]
    result = run(events, capacity_bytes=40 * MiB)
    # event 4: 24 cached + 30 = 54 > 40 -> release_cached_blocks frees both 12 MiB segments,
    # retry: 30 <= 40. Event 5: 30 + 12 = 42 > 40 and nothing cached -> OOM, not allocated;
    # event 6 frees the failed key: ignored. Event 7 caches the 30 MiB segment.
    assert result.ooms == (5,)
    expected = [(12, 12), (24, 24), (12, 24), (0, 24), (30, 30), (30, 30), (30, 30), (0, 30)]
    assert trace(result) == [(a * MiB, r * MiB) for a, r in expected]
    assert run(events).ooms == ()


def test_capacity_pressure_releases_only_enough_oversize_blocks() -> None:
    events = [(40 * MiB, 1), (50 * MiB, 2), (-40 * MiB, 1), (-50 * MiB, 2), (20 * MiB, 3)]
    result = run(events, max_split_size_bytes=32 * MiB, capacity_bytes=100 * MiB)
    # 20 MiB < max_split: no cached block usable; 90 + 20 > 100. release_available_cached_blocks
    # frees the smallest block >= max(20, 32) MiB, the 40 MiB one: 50 + 20 = 70 MiB
    assert trace(result)[-1] == (20 * MiB, 70 * MiB)
    # without max_split_size the cached 40 MiB block is split for it: 90 MiB stay reserved
    assert trace(run(events, capacity_bytes=100 * MiB))[-1] == (20 * MiB, 90 * MiB)


def test_capacity_pressure_unmaps_free_pages_of_expandable_segments() -> None:
    # stream 0 maps 40 MiB for 30 MiB and frees it; stream 1 needs 40 MiB of its own:
    # 40 + 40 > 60 -> release_cached_blocks unmaps stream 0's 2 free pages, retry fits.
    events = [(30 * MiB, 1), (-30 * MiB, 1), (30 * MiB, 2)]
    result = run(events, streams=[0, 0, 1], expandable_segments=True, capacity_bytes=60 * MiB)
    assert trace(result) == [(30 * MiB, 40 * MiB), (0, 40 * MiB), (30 * MiB, 40 * MiB)]
    assert (result.ooms, result.segments_created) == ((), 2)
    assert run(events, streams=[0, 0, 1], expandable_segments=True).peak_reserved_bytes == 80 * MiB


# --- settings parsing -----------------------------------------------------------------------


def test_from_conf_reads_the_pytorch_keys() -> None:
    conf = AllocatorSettings.from_conf(
        " max_split_size_mb:128, expandable_segments:True,roundup_power2_divisions:4", capacity_bytes=80 * GiB
    )
    expected = AllocatorSettings(
        max_split_size_bytes=128 * MiB, expandable_segments=True, roundup_power2_divisions=4, capacity_bytes=80 * GiB
    )
    assert conf == expected
    assert AllocatorSettings.from_conf("") == AllocatorSettings()
    ignored = AllocatorSettings.from_conf("garbage_collection_threshold:0.6,max_split_size_mb:64")
    assert (ignored.ignored_options, ignored.max_split_size_bytes) == (("garbage_collection_threshold",), 64 * MiB)
    intervals = AllocatorSettings.from_conf("roundup_power2_divisions:[256:1,512:2,>:4]").roundup_power2_intervals
    assert intervals == (1,) * 9 + (2,) + (4,) * 6
    # a later value replaces an earlier one, as in PyTorch's parser
    twice = AllocatorSettings.from_conf("roundup_power2_divisions:[256:1,>:2],roundup_power2_divisions:4")
    assert twice.divisions_by_interval() == (4,) * 16


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_split_size:128", r"unknown key 'max_split_size'.*max_split_size_mb"),
        ("max_split_size_mb:10", r"max_split_size_mb must be >= 20"),
        ("max_split_size_mb:big", r"max_split_size_mb expects a non-negative integer"),
        ("max_split_size_mb", r"expected ':' after 'max_split_size_mb'"),
        ("max_split_size_mb:", r"max_split_size_mb needs a value"),
        ("roundup_power2_divisions:3", r"roundup_power2_divisions must be a power of two"),
        ("roundup_power2_divisions:[256:3]", r"roundup_power2_divisions divisions must be 0 or a power of two"),
        ("roundup_power2_divisions:[300:2]", r"interval must be a power of two"),
        ("roundup_power2_divisions:[256:2", r"no closing"),
        ("expandable_segments:yes", r"expandable_segments accepts True or False"),
        ("backend:cudaMallocAsync", r"backend 'cudaMallocAsync' is not modeled"),
        ("expandable_segments:True;max_split_size_mb:128", r"expandable_segments accepts True or False"),
    ],
)
def test_from_conf_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AllocatorSettings.from_conf(text)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_split_size_bytes": MiB}, "max_split_size_bytes"),
        ({"max_split_size_bytes": True}, "max_split_size_bytes"),
        ({"roundup_power2_divisions": 3}, "roundup_power2_divisions"),
        ({"expandable_segments": "yes"}, "expandable_segments"),
        ({"capacity_bytes": 0}, "capacity_bytes"),
        ({"max_non_split_rounding_bytes": MiB}, "max_non_split_rounding_bytes"),
        ({"roundup_power2_intervals": (2,) * 15}, "roundup_power2_intervals"),
    ],
)
def test_settings_validation_names_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"AllocatorSettings.{field}"):
        AllocatorSettings(**options)


# --- event stream conventions ---------------------------------------------------------------


def test_allocating_a_live_key_names_the_event() -> None:
    with pytest.raises(ValueError, match="event 1 allocates key 7"):
        run([(100, 7), (100, 7)])
    # a freed key can be allocated again
    assert run([(100, 7), (-100, 7), (100, 7)]).allocated_bytes.tolist() == [512, 0, 512]


def test_zero_sizes_and_unknown_frees_are_no_ops() -> None:
    result = run([(0, 1), (-5, 99), (1, 2), (0, 2), (-1, 3)])
    assert trace(result) == [(0, 0), (0, 0), (512, 2 * MiB), (512, 2 * MiB), (512, 2 * MiB)]
    assert result.peak_index == 2
    empty = run([])
    assert (empty.peak_index, empty.peak_reserved_bytes, empty.fragmentation) == (-1, 0, 0.0)


def test_bad_arrays_are_rejected() -> None:
    with pytest.raises(ValueError, match="1-D of one length"):
        replay(np.array([1, 2]), np.array([1]))
    with pytest.raises(ValueError, match="streams must match"):
        replay(np.array([1, 2]), np.array([1, 2]), np.array([0], dtype=np.int32))
    with pytest.raises(ValueError, match="integers"):
        replay(np.array([1.5]), np.array([1]))


# --- properties of random timelines ---------------------------------------------------------

SIZES = st.one_of(
    st.integers(1, 64 * KiB),
    st.integers(64 * KiB, 2 * MiB),
    st.integers(2 * MiB, 12 * MiB),
    st.integers(12 * MiB, 90 * MiB),
)
SETTINGS = [
    {},
    {"expandable_segments": True},
    {"max_split_size_bytes": 32 * MiB},
    {"roundup_power2_divisions": 4},
    {"max_split_size_bytes": 24 * MiB, "expandable_segments": True},
]


@st.composite
def timelines(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[int]]:
    """Random allocations and frees (of live keys, sometimes of unknown ones) on two streams."""
    events: list[tuple[int, int]] = []
    streams: list[int] = []
    live: dict[int, int] = {}
    for key in range(draw(st.integers(1, 70))):
        if live and draw(st.booleans()):
            victim = draw(st.sampled_from(sorted(live)))
            events.append((-live.pop(victim), victim))
        else:
            live[key] = draw(SIZES)
            events.append((live[key], key))
        streams.append(draw(st.integers(0, 1)))
    events += [(-size, key) for key, size in live.items()]
    streams += [0] * len(live)
    return events, streams


def _slack_bound(rounded: int, options: dict[str, Any]) -> int:
    """Most bytes a block can exceed its rounded request by (see ``should_split``/``get_free_block``)."""
    if rounded <= MiB or options.get("expandable_segments"):
        return 0  # split whenever >= 512 B would remain, and all sizes are multiples of 512
    if rounded < options.get("max_split_size_bytes", 1 << 64):
        return MiB  # not split only when <= 1 MiB remains
    return 20 * MiB  # oversize: reused block < request + 20 MiB, fresh segment < request + 2 MiB


@settings(max_examples=150, deadline=None)
@given(timelines(), st.sampled_from(SETTINGS))
def test_allocated_and_reserved_bounds_on_random_timelines(
    timeline: tuple[list[tuple[int, int]], list[int]], options: dict[str, Any]
) -> None:
    events, streams = timeline
    result = run(events, streams=streams, **options)
    live: dict[int, int] = {}
    for (size, key), allocated, reserved in zip(events, result.allocated_bytes, result.reserved_bytes, strict=True):
        if size > 0:
            live[key] = size
        else:
            live.pop(key, None)
        rounded = [round_size(s, AllocatorSettings(**options)) for s in live.values()]
        assert reserved >= allocated >= sum(rounded) >= sum(live.values())
        assert allocated - sum(rounded) <= sum(_slack_bound(r, options) for r in rounded)
    assert result.ooms == ()
    # no capacity: segments are never released, so reserved never shrinks; all freed at the end
    assert (np.diff(result.reserved_bytes) >= 0).all()
    assert result.allocated_bytes[-1] == 0
    assert result.reserved_bytes[-1] == result.peak_reserved_bytes
    assert result.reserved_bytes[result.peak_index] == result.peak_reserved_bytes


@settings(max_examples=150, deadline=None)
@given(timelines(), st.sampled_from(SETTINGS), st.sampled_from([30 * MiB, 64 * MiB, 128 * MiB]))
def test_capacity_is_never_exceeded_and_ooms_allocate_nothing(
    timeline: tuple[list[tuple[int, int]], list[int]], options: dict[str, Any], capacity: int
) -> None:
    events, streams = timeline
    result = run(events, streams=streams, capacity_bytes=capacity, **options)
    assert (result.reserved_bytes <= capacity).all()
    assert (result.reserved_bytes >= result.allocated_bytes).all()
    for index in result.ooms:
        assert events[index][0] > 0
        before = result.allocated_bytes[index - 1] if index else 0
        assert result.allocated_bytes[index] == before


def _audit(model: CachingAllocatorModel, live: dict[int, Block]) -> None:
    """Segments tile without gaps, free neighbours are merged, pools are sorted, stats add up."""
    heads: dict[int, Block] = {}
    for pool in model.pools():
        assert pool.keys == sorted(pool.keys) and [b.key for b in pool.blocks] == pool.keys
        assert all(not b.allocated and b.mapped for b in pool.blocks)
        assert all(not b.mapped for b in pool.unmapped)
        for block in [*pool.blocks, *pool.unmapped]:
            while block.prev is not None:
                block = block.prev
            heads[block.addr] = block
    for block in live.values():
        assert block.allocated
        while block.prev is not None:
            block = block.prev
        heads[block.addr] = block
    mapped = 0
    for head in heads.values():
        block: Block | None = head
        while block is not None:
            mapped += block.size if block.mapped else 0
            after = block.next
            if after is not None:
                assert block.addr + block.size == after.addr and after.prev is block
                both_free = not block.allocated and not after.allocated
                assert not (both_free and block.mapped == after.mapped), "unmerged free neighbours"
            block = after
    assert mapped == model.reserved
    assert sum(b.size for b in live.values()) == model.allocated


@settings(max_examples=150, deadline=None)
@given(timelines(), st.sampled_from(SETTINGS), st.sampled_from([None, 40 * MiB, 100 * MiB]))
def test_model_structure_stays_consistent(
    timeline: tuple[list[tuple[int, int]], list[int]], options: dict[str, Any], capacity: int | None
) -> None:
    events, streams = timeline
    chosen = AllocatorSettings(capacity_bytes=capacity, **options)
    model = CachingAllocatorModel(
        divisions_by_interval=chosen.divisions_by_interval(),
        max_split_size=chosen.max_split_size_bytes,
        expandable=chosen.expandable_segments,
        capacity=capacity,
    )
    live: dict[int, Block] = {}
    for (size, key), stream in zip(events, streams, strict=True):
        if size > 0:
            block = model.malloc(size, stream)
            if block is not None:
                live[key] = block
        elif key in live:
            model.free(live.pop(key))
        _audit(model, live)

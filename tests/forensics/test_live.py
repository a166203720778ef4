"""Forensics on hand-built timelines: allocation lifetimes, live sets, step boundaries, leaks and OOMs.

Every expected number is worked out by hand from the events next to it.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from collections.abc import Sequence

import pytest

from vramlens.allocator import replay
from vramlens.categories import Category
from vramlens.forensics.live import find_leaks, lifetimes, live_allocations, module_breakdown, step_ends
from vramlens.forensics.oom import explain_oom
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder
from vramlens.simulator.report import allocated_timeline

MiB = 1 << 20
Event = tuple[int, Category, int, str | None, str | None, str | None]  # nbytes, category, storage, phase, module, stack


def build(events: Sequence[Event], **metadata: object) -> Timeline:
    """A timeline stamped with event numbers; strings are interned into its tables."""
    builder = TimelineBuilder(time_unit="event")
    for time, (nbytes, category, storage, phase, module, stack) in enumerate(events):
        builder.append(
            time,
            nbytes,
            CATEGORY_ORDER.index(category),
            storage,
            builder.code("phase", phase),
            builder.code("module", module),
            builder.code("stack", stack),
        )
    return builder.build(metadata=dict(metadata))


ACT, TEMP, PARAMS = Category.ACTIVATIONS, Category.TEMPORARY, Category.PARAMETERS
GRADS, STATE = Category.GRADIENTS, Category.OPTIMIZER_STATE


def test_lifetimes_pair_reused_storage_ids_and_skip_unmatched_frees() -> None:
    timeline = build(
        [
            (100, ACT, 5, None, None, None),  # 0: storage 5, first life
            (-50, ACT, 9, None, None, None),  # 1: free of memory allocated before recording
            (-100, ACT, 5, None, None, None),  # 2: ends the first life
            (300, ACT, 5, None, None, None),  # 3: storage id 5 reused: second life, never freed
            (40, ACT, 7, None, None, None),  # 4
            (-40, ACT, 7, None, None, None),  # 5
        ]
    )
    lives = lifetimes(timeline)
    # Allocations at events 0, 3, 4; their frees at 2, never (6 = len), 5.
    assert lives.start.tolist() == [0, 3, 4]
    assert lives.end.tolist() == [2, 6, 5]
    assert lives.live_at(1).tolist() == [0]
    assert lives.live_at(4).tolist() == [1, 2]


def test_live_allocations_largest_first_with_age_module_phase_and_innermost_stack() -> None:
    stack = "train.py:10 in main\nmodel.py:20 in forward"  # outermost first, as the tracker stores it
    timeline = build(
        [
            (1000, PARAMS, 0, "load", None, None),  # 0
            (3000, ACT, 1, "forward", "m.layers.0", stack),  # 1
            (2500, ACT, 2, "forward", "m.layers.1", None),  # 2
            (900, TEMP, 3, "backward", "m.layers.1", None),  # 3 <- the instant looked at
            (-3000, ACT, 1, "backward", "m.layers.1", None),  # 4: freed while layers.1 runs
        ]
    )
    lives = lifetimes(timeline)
    top = live_allocations(timeline, lives, 3, count=2)
    assert [item.nbytes for item in top] == [3000, 2500]
    first = top[0]
    assert (first.event, first.category, first.module, first.phase, first.age) == (1, ACT, "m.layers.0", "forward", 2)
    assert first.stack == ("model.py:20 in forward", "train.py:10 in main")  # innermost first
    assert first.to_dict()["age_events"] == 2
    # Modules at event 3: layers.0 3000, layers.1 2500 + 900 = 3400, no module 1000 (parameters).
    assert module_breakdown(timeline, lives, 3) == {"m.layers.1": 3400, "m.layers.0": 3000, "": 1000}
    # After event 4 the 3000 B activation is gone, although its free ran in layers.1: it is
    # subtracted from the module that allocated it.
    assert module_breakdown(timeline, lives, 4) == {"m.layers.1": 3400, "": 1000}


def _training_steps(steps: int, kept_stack: str | None = "train.py:30 in step\nloss.py:5 in keep") -> Timeline:
    """``steps`` training steps of: forward activation (freed in backward), a gradient (freed in
    the next step's backward, re-allocated), optimizer state (allocated once, in step 0), and
    one 64-byte tensor per step that is never freed (the leak)."""
    events: list[Event] = [(4096, PARAMS, 0, "load", None, "train.py:1 in main")]
    serial = 1
    grad = None
    for step in range(steps):
        events.append((1024, ACT, serial, "forward", "m", "train.py:20 in step"))
        act, serial = serial, serial + 1
        events.append((64, ACT, serial, "forward", None, kept_stack))  # kept forever
        serial += 1
        if grad is not None:
            events.append((-4096, GRADS, grad, "backward", None, None))
        events.append((4096, GRADS, serial, "backward", None, "train.py:22 in step"))
        grad, serial = serial, serial + 1
        events.append((-1024, ACT, act, "backward", None, None))
        if step == 0:
            events.append((8192, STATE, serial, "optimizer_step", None, "adam.py:9 in step"))
            serial += 1
        events.append((512, TEMP, serial, "optimizer_step", None, "adam.py:12 in step"))
        events.append((-512, TEMP, serial, "optimizer_step", None, None))
        serial += 1
    return build(events)


def test_step_ends_from_optimizer_steps_numbered_phases_recurrence_and_metadata() -> None:
    timeline = _training_steps(3)
    ends, rule = step_ends(timeline)
    # Every step has 7 events after the load event (step 0 creates the optimizer state, later
    # steps free the previous gradient instead): ends 7, 14, 21.
    assert (ends, rule) == ((7, 14, 21), "end of each optimizer_step")

    numbered = build([(10, ACT, i, f"ProfilerStep#{i // 2}", None, None) for i in range(6)])
    assert step_ends(numbered) == ((1, 3, 5), "numbered phases")

    phases = ["load", "forward", "backward", "forward", "backward", "forward"]
    recurring = build([(10, ACT, i, phase, None, None) for i, phase in enumerate(phases)])
    # forward starts at events 1, 3, 5: steps end at 2, 4 and the last event.
    assert step_ends(recurring) == ((2, 4, 5), "each start of forward")

    windows = [{"step": 1, "start": 0, "end": 2}, {"step": 2, "start": 3, "end": 4}]
    recorded = build([(10, ACT, i, None, None, None) for i in range(6)], steps=windows)
    assert step_ends(recorded) == ((2, 4), "recorded step windows")

    assert step_ends(build([(10, ACT, 0, "forward", None, None)])) == ((), "no repeated steps")


def _step_ends_by_spans(timeline: Timeline) -> tuple[tuple[int, ...], str]:
    """step_ends' rules applied run by run to ``phase_spans()`` (the reference for the arrays)."""
    spans = [span for span in timeline.phase_spans() if span[0]]
    pattern = re.compile(r"^(?P<prefix>.*?\D)[#_\- ]?(?P<number>\d+)$")
    matches = [(pattern.match(name), last) for name, _, last in spans]
    prefixes = Counter(match.group("prefix") for match, _ in matches if match)
    if prefixes:
        prefix = prefixes.most_common(1)[0][0]
        last_of: dict[int, int] = {}
        for match, last in matches:
            if match and match.group("prefix") == prefix:
                last_of[int(match.group("number"))] = max(last_of.get(int(match.group("number")), -1), last)
        if len(last_of) >= 2:
            return tuple(sorted(last_of.values())), "numbered phases"
    optimizer = tuple(last for name, _, last in spans if name == "optimizer_step")
    if len(optimizer) >= 2:
        return optimizer, "end of each optimizer_step"
    working = [span for span in spans if span[0] != "load"]
    starts = [begin for name, begin, _ in working if working and name == working[0][0]]
    if len(starts) >= 2:
        return (*(begin - 1 for begin in starts[1:]), len(timeline) - 1), f"each start of {working[0][0]}"
    return (), "no repeated steps"


@pytest.mark.parametrize("seed", range(40))
def test_step_ends_on_arrays_follow_the_rules_run_by_run(seed: int) -> None:
    """Random phase sequences (numbered names with ties between prefixes, optimizer steps,
    loads, unnamed events, an empty name): the array version gives the run-by-run answer."""
    rng = random.Random(seed)
    vocabulary = rng.choice(
        [
            ["step_1", "step_2", "step#3", "iter 1", "iter 2", "load", None],
            ["forward", "backward", "optimizer_step", "load", None, ""],
            ["load", "prefill", "decode", None],
            ["ProfilerStep#7", "ProfilerStep#12", "x9", "y9", "optimizer_step"],
        ]
    )
    phases = [rng.choice(vocabulary) for _ in range(rng.randint(1, 60))]
    timeline = build([(8, ACT, i, phase, None, None) for i, phase in enumerate(phases)])
    assert step_ends(timeline) == _step_ends_by_spans(timeline)


def test_find_leaks_flags_only_the_tensor_kept_every_step() -> None:
    timeline = _training_steps(4)
    lives = lifetimes(timeline)
    ends, _ = step_ends(timeline)
    leaks = find_leaks(timeline, lives, ends, min_steps=2)
    assert len(leaks) == 1
    leak = leaks[0]
    # One 64 B tensor per step; at the end of step 3 those of steps 0, 1, 2 are older than the
    # last step: 3 of them, 192 B, the oldest survived 3 step ends. Live totals at the 4 step
    # ends: 64, 128, 192, 256 -> (256 - 64) / 3 = 64 B per step.
    assert (leak.count, leak.nbytes, leak.bytes_per_step, leak.oldest_steps) == (3, 192, 64, 3)
    assert leak.totals == (64, 128, 192, 256)
    assert leak.stack == ("loss.py:5 in keep", "train.py:30 in step") and leak.category is ACT
    # Gradients (re-allocated each step) and optimizer state (allocated once) are not leaks;
    # asking for more survived steps than the run has finds nothing.
    assert find_leaks(timeline, lives, ends, min_steps=4) == ()
    assert find_leaks(timeline, lives, ends[:1]) == ()


def test_find_leaks_without_stacks_groups_by_module_and_category() -> None:
    timeline = _training_steps(3, kept_stack=None)
    leaks = find_leaks(timeline, lifetimes(timeline), step_ends(timeline)[0])
    assert [(leak.stack, leak.module, leak.count) for leak in leaks] == [((), "", 2)]


def test_a_cache_that_is_replaced_by_a_bigger_one_is_not_a_leak() -> None:
    events: list[Event] = []
    for step in range(4):
        events.append(((step + 1) * 100, ACT, step, "forward", None, "cache.py:3 in grow"))
        if step:
            events.append((-step * 100, ACT, step - 1, "forward", None, None))
        events.append((10, TEMP, 100 + step, "optimizer_step", None, None))
        events.append((-10, TEMP, 100 + step, "optimizer_step", None, None))
    timeline = build(events)
    # The live total grows (100, 200, 300, 400) but only the newest cache lives: nothing
    # allocated in an earlier step survives, so it is growth, not a leak.
    assert find_leaks(timeline, lifetimes(timeline), step_ends(timeline)[0]) == ()


def _direct_leaks(timeline: Timeline, ends: tuple[int, ...], min_steps: int) -> dict[str, tuple[int, ...]]:
    """Reference for find_leaks, by a direct walk of the events (quadratic; small timelines only):
    each stack's live total at every step end, for the stacks whose total never shrinks and ends
    above where it started, and whose allocations of at least two earlier steps, the oldest
    ``min_steps`` step ends old, are live at the last end."""
    totals: dict[str, list[int]] = {}
    survivors: dict[str, set[int]] = {}
    for position, end in enumerate(ends):
        live: dict[int, tuple[int, str, int]] = {}
        for index in range(end + 1):
            storage, nbytes = int(timeline.storage[index]), int(timeline.nbytes[index])
            if nbytes > 0:
                step = next(k for k, mark in enumerate(ends) if mark >= index)
                live[storage] = (nbytes, timeline.stacks[int(timeline.stack[index])], step)
            else:
                live.pop(storage, None)
        for nbytes, stack, _ in live.values():
            totals.setdefault(stack, [0] * len(ends))[position] += nbytes
        if position == len(ends) - 1:
            for _, stack, step in live.values():
                if step < position:
                    survivors.setdefault(stack, set()).add(step)
    last = len(ends) - 1
    return {
        stack: tuple(values)
        for stack, values in totals.items()
        if all(b >= a for a, b in itertools.pairwise(values))
        and values[-1] > values[0]
        and len(survivors.get(stack, ())) >= 2
        and last - min(survivors[stack]) >= min_steps
    }


def _random_steps(seed: int) -> Timeline:
    """3-9 steps of allocations from three stacks; ``keep`` frees few of its tensors, the others most."""
    rng = random.Random(seed)
    events: list[Event] = []
    live: list[tuple[int, int, str]] = []
    for step in range(rng.randint(3, 9)):
        for storage in range(step * 100, step * 100 + rng.randint(1, 12)):
            size, stack = rng.choice((8, 64, 512)), rng.choice(("keep.py:1 in k", "a.py:2 in f", "b.py:3 in g"))
            events.append((size, ACT, storage, "forward", None, stack))
            live.append((storage, size, stack))
        for item in [item for item in live if rng.random() < (0.15 if item[2].startswith("keep") else 0.8)]:
            live.remove(item)
            events.append((-item[1], ACT, item[0], "forward", None, None))
        events.append((4, TEMP, 10**6 + step, "optimizer_step", None, None))
        events.append((-4, TEMP, 10**6 + step, "optimizer_step", None, None))
    return build(events)


@pytest.mark.parametrize("seed", range(16))
def test_find_leaks_matches_a_direct_walk(seed: int) -> None:
    """The sparse per-(stack, step end) changes find the same leaks with the same live totals as
    walking the events; over the seeds, leaks are found and some stacks are rejected."""
    timeline = _random_steps(seed)
    ends, _ = step_ends(timeline)
    found = {leak.stack[0]: leak.totals for leak in find_leaks(timeline, lifetimes(timeline), ends, min_steps=1)}
    assert found == _direct_leaks(timeline, ends, min_steps=1)


def test_the_random_leak_cases_are_not_vacuous() -> None:
    counts = []
    for seed in range(16):
        timeline = _random_steps(seed)
        counts.append(len(find_leaks(timeline, lifetimes(timeline), step_ends(timeline)[0], min_steps=1)))
    assert 0 < sum(counts) < 3 * 16 and counts.count(0) < 16


def _oom_timeline(**metadata: object) -> Timeline:
    """Parameters 200 MiB, gradients 200 MiB, optimizer state 400 MiB, four layers' activations
    (100 MiB each), then a 300 MiB temporary allocated and freed just before the OOM."""
    events: list[Event] = [
        (200 * MiB, PARAMS, 0, "load", None, None),
        (200 * MiB, GRADS, 1, "backward", None, None),
        (400 * MiB, STATE, 2, "optimizer_step", None, None),
    ]
    events += [(100 * MiB, ACT, 10 + i, "forward", f"Model.model.layers.{i}.mlp", None) for i in range(4)]
    events += [(300 * MiB, TEMP, 20, "forward", None, None), (-300 * MiB, TEMP, 20, "forward", None, None)]
    return build(events, **metadata)


_OOM = {"event": 8, "requested_bytes": 64 * MiB, "device_free_bytes": 10 * MiB, "time_us": 5, "stream": 0}


def test_oom_forensics_from_the_allocator_replay() -> None:
    timeline = _oom_timeline()
    replayed = replay(timeline.nbytes, timeline.storage)
    oom = explain_oom(
        _OOM, timeline=timeline, rounded=allocated_timeline(timeline), lives=lifetimes(timeline), replayed=replayed
    )
    # Live: 200 + 200 + 400 + 4 x 100 = 1200 MiB (whole MiB: rounding changes nothing).
    assert oom.live_bytes == oom.allocated_bytes == 1200 * MiB
    assert oom.breakdown == {PARAMS: 200 * MiB, GRADS: 200 * MiB, STATE: 400 * MiB, ACT: 400 * MiB}
    # The replay keeps the freed 300 MiB segment cached: reserved 1500 MiB, cached 300 MiB.
    assert (oom.reserved_bytes, oom.cached_bytes) == (1500 * MiB, 300 * MiB)
    assert oom.cached_source.startswith("allocator replay")
    # 64 MiB (a multiple of 2 MiB) needs a 64 MiB segment; 10 MiB were free: short by 54 MiB.
    assert oom.shortfall_bytes == 54 * MiB
    saves = {item.change.split(" ")[0]: (item.saves_bytes, item.avoids_oom) for item in oom.suggestions}
    assert saves == {
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True": (300 * MiB, True),  # the cached bytes
        # 54/400 of the 400 MiB of activations -> 14%: 400 MiB x 14 // 100 = 56 MiB >= 54 MiB.
        "reduce": (400 * MiB * 14 // 100, True),
        "activation": (300 * MiB, True),  # 400 MiB in 4 layers minus the largest layer (100 MiB)
        "an": (300 * MiB, True),  # 8-bit optimizer: 3/4 of 400 MiB
        "shard": (300 * MiB, True),  # (400 + 200) MiB over 2 ranks: half of it
    }
    assert [item.cost for item in oom.suggestions] == [0, 1, 2, 3, 4]  # all avoid it: cheapest first
    assert "14%" in oom.suggestions[1].change
    assert [item.nbytes for item in oom.top_allocations[:3]] == [400 * MiB, 200 * MiB, 200 * MiB]


def test_oom_forensics_known_batch_measured_segments_and_ordering() -> None:
    timeline = _oom_timeline(batch=8, reserved_bytes=1600 * MiB, segments_allocated_bytes=1200 * MiB)
    entry = {**_OOM, "device_free_bytes": 0, "requested_bytes": 500 * MiB}
    oom = explain_oom(entry, timeline=timeline, rounded=timeline, lives=lifetimes(timeline), replayed=None)
    # The OOM follows the last event, so the snapshot's segments describe it: 1600 - 1200 = 400 MiB cached.
    assert (oom.reserved_bytes, oom.cached_bytes) == (1600 * MiB, 400 * MiB)
    assert oom.cached_source.startswith("snapshot segments")
    assert oom.shortfall_bytes == 500 * MiB  # nothing free
    by_change = {item.change: item for item in oom.suggestions}
    # Batch 8: 400 MiB of activations, 50 MiB per sample; 500 MiB would need all of them and
    # more, so the largest cut (8 -> 1, 350 MiB) does not avoid it.
    assert by_change["batch 8 -> 1"].saves_bytes == 350 * MiB and by_change["batch 8 -> 1"].avoids_oom is False
    # Sharding 600 MiB: 2 ranks save 300, 4 ranks save 450, 8 ranks 525 >= 500.
    sharding = next(item for item in oom.suggestions if item.change.startswith("shard"))
    assert "over 8" in sharding.change and sharding.saves_bytes == 600 * MiB - 600 * MiB // 8
    verdicts = [item.avoids_oom for item in oom.suggestions]
    assert verdicts == sorted(verdicts, key=lambda v: v is not True)  # avoiding changes come first
    assert oom.to_dict()["suggestions"][0]["avoids_oom"] is True


def test_oom_without_free_bytes_has_no_verdicts_and_bad_entries_are_refused() -> None:
    timeline = _oom_timeline()
    oom = explain_oom(
        {"event": 8, "requested_bytes": MiB}, timeline=timeline, rounded=timeline, lives=None, replayed=None
    )
    assert oom.shortfall_bytes is None and oom.cached_bytes is None and oom.top_allocations == ()
    assert all(item.avoids_oom is None for item in oom.suggestions)
    with pytest.raises(ValueError, match=r"^metadata\.oom\.requested_bytes: expected an integer"):
        explain_oom(
            {"event": 1, "requested_bytes": "big"}, timeline=timeline, rounded=timeline, lives=None, replayed=None
        )

"""``vramlens._records``: a record made by its maker, or copied by its replacer, is the one its
dataclass ``__init__`` (or ``dataclasses.replace``) makes; classes it cannot make that way are refused."""

from __future__ import annotations

import dataclasses

import pytest

from vramlens._records import maker, replacer
from vramlens.result.report import Margin, SafeLevels


def test_a_made_record_is_the_record_init_makes() -> None:
    made = maker(Margin)(kind="data noise", level="allocated", bytes=12, source="calibrated")
    assert made == Margin(kind="data noise", level="allocated", bytes=12, source="calibrated")
    assert type(made) is Margin and repr(made) == repr(
        Margin(kind="data noise", level="allocated", bytes=12, source="calibrated")
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        maker(Margin)(kind="data noise", level="allocated", bytes=12)  # every field is given
    safe = maker(SafeLevels)(allocated_bytes=1, reserved_bytes=2, device_bytes=3, margins=(made,))
    assert safe == SafeLevels(allocated_bytes=1, reserved_bytes=2, device_bytes=3, margins=(made,))


def test_a_replaced_record_is_dataclasses_replace() -> None:
    margin = Margin(kind="data noise", level="allocated", bytes=12, source="calibrated")
    assert replacer(Margin, "bytes", "level")(margin, 99, "reserved") == dataclasses.replace(
        margin, bytes=99, level="reserved"
    )
    with pytest.raises(TypeError, match="no field"):
        replacer(Margin, "size")


def test_a_class_with_post_init_or_without_slots_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("value")

    @dataclasses.dataclass(frozen=True)
    class Plain:
        value: int

    for cls in (Checked, Plain):
        with pytest.raises(TypeError, match="only a slotted dataclass"):
            maker(cls)

from __future__ import annotations

import gc

from infra.collector import HOT_GEN0_THRESHOLD, raise_young_threshold


def test_raise_young_threshold_changes_the_first_generation_only() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        raise_young_threshold()
        assert gc.get_threshold() == (HOT_GEN0_THRESHOLD, 7, 9)
        raise_young_threshold(1234)
        assert gc.get_threshold() == (1234, 7, 9)
    finally:
        gc.set_threshold(*before)

import math

import pytest

from lift3d.schedule import scheduled_value, validate_schedule


def test_constant_and_linear_ramp():
    assert scheduled_value(0.5, 100) == 0.5
    ramp = [10, 1.0, 3.0, 20]
    assert scheduled_value(ramp, 0) == 1.0
    assert scheduled_value(ramp, 10) == 1.0
    assert scheduled_value(ramp, 15) == pytest.approx(2.0)
    assert scheduled_value(ramp, 20) == 3.0
    assert scheduled_value(ramp, 1000) == 3.0


def test_log_ramp_is_geometric():
    ramp = [0, 1e-2, 1e-4, 100, "log"]
    assert scheduled_value(ramp, 50) == pytest.approx(1e-3)
    assert scheduled_value(ramp, 100) == pytest.approx(1e-4)


def test_piecewise_linear_and_step():
    points = [[0, 0.0], [10, 1.0], [30, 0.0]]
    assert scheduled_value(points, 5) == pytest.approx(0.5)
    assert scheduled_value(points, 20) == pytest.approx(0.5)
    assert scheduled_value(points, 40) == 0.0
    stepped = [[0, 64], [100, 256], "step"]
    assert scheduled_value(stepped, 99) == 64
    assert scheduled_value(stepped, 100) == 256


@pytest.mark.parametrize(
    "bad, message",
    [
        ([1, 2, 3], "ramp schedule"),
        ([10, 1.0, 2.0, 5], "before start_step"),
        ([[0, 1], [5]], "pairs"),
        ([[5, 1], [0, 2]], "non-decreasing"),
        ([0, 0.0, 1.0, 10, "log"], "positive"),
        ([0, 1.0, 2.0, 10, "cubic"], "unknown schedule mode"),
        ("fast", "schedule list"),
        (True, "boolean"),
    ],
)
def test_invalid_schedules_name_the_problem(bad, message):
    with pytest.raises(ValueError, match=message):
        validate_schedule(bad)


def test_degenerate_ramp_switches_at_end_step():
    assert scheduled_value([5, 1.0, 2.0, 5], 4) == 1.0
    assert scheduled_value([5, 1.0, 2.0, 5], 5) == 2.0
    assert math.isfinite(scheduled_value([0, 1.0, 2.0, 0], 0))

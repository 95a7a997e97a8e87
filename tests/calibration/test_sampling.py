"""Sampling around other processes' load: clean windows kept, outside load reported, the least
disturbed windows taken (and said) when none is clean."""
import itertools
import time

import pytest

from calibration.sampling import Window, sample_clean


def test_sample_clean_keeps_clean_windows_and_reports_noise(monkeypatch):
    calls = []

    def unit(i):
        calls.append(i)
        return [("a", float(i)), ("b", -float(i))]
    # no outside load: stops once every key has `want` samples
    monkeypatch.setattr(Window, "others", lambda self: 0.0)
    got, noise = sample_clean(unit, want=4, budget_s=5, min_window_s=0.0, keys=2)
    assert len(got["a"]) == 4 and len(got["b"]) == 4 and noise.clean == noise.windows == 4
    assert not noise.used_all and "4/4 windows" in noise.describe()
    # always loaded: runs out its budget, then falls back to every sample and says so
    monkeypatch.setattr(Window, "others", lambda self: 0.9)
    ticks = []
    got, noise = sample_clean(unit, want=3, budget_s=0.05, min_window_s=0.01, keys=2,
                              tick=lambda: ticks.append(1))
    assert noise.used_all and noise.clean == 0 and noise.others == pytest.approx(0.9)
    assert len(got["a"]) >= 2 and len(ticks) == 3 and "least disturbed" in noise.describe()
    # some windows disturbed more than others: the fallback takes the quietest first
    calls.clear()
    shares = itertools.cycle([0.9, 0.3, 0.8, 0.5, 0.95, 0.6])
    monkeypatch.setattr(Window, "others", lambda self: next(shares))
    got, noise = sample_clean(unit, want=6, budget_s=0.02, min_window_s=0.0, keys=2)
    assert noise.used_all and noise.fallback_others == 0.3
    assert got["a"][:2] == [calls[1], calls[7]]  # the first windows that saw the least load (0.3)


def test_window_measures_outside_load():
    w = Window()
    time.sleep(0.05)
    assert 0.0 <= w.others() <= 1.0 and w.wall() >= 0.05

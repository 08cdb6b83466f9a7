"""fullfuse.measure's host-time harnesses on CPU (the GPU synchronisation a no-op): which calls they make, in which
order, and what they report."""
import itertools

import torch

from fullfuse import measure


def test_repeated_host_us_runs_each_call_in_blocks_and_reports_each(monkeypatch):
    """repeated_host_us: one untimed warm-up call each, then blocks of ``block`` consecutive calls of one function,
    every function once per round; a median in µs per function."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    seen = []
    fns = {name: (lambda name=name: seen.append(name)) for name in "abc"}
    got = measure.repeated_host_us(fns, calls=60, block=20)
    assert sorted(got) == ["a", "b", "c"] and all(v >= 0 for v in got.values())
    assert seen[:3] == ["a", "b", "c"]
    runs = [(name, len(list(group))) for name, group in itertools.groupby(seen[3:])]
    assert sum(n for _, n in runs) == 180 and all(n % 20 == 0 for _, n in runs)
    assert all(seen[3:].count(name) == 60 for name in "abc")
    rounds = [sorted(seen[3 + 60 * r:3 + 60 * (r + 1):20]) for r in range(3)]
    assert rounds == [["a", "b", "c"]] * 3

"""fullfuse.runtime's context handling on CPU (the driver calls faked): a driver call runs with the device's primary
context current and leaves the thread's own current afterwards — torch's current device never changes, a thread
with no context gets none left behind, and an error restores it too."""
import pytest

from fullfuse import runtime


class FakeContexts:
    def __init__(self, current):
        self.current, self.sets = current, []

    def get(self):
        return 0, self.current

    def set(self, ctx):
        self.sets.append(ctx)
        self.current = ctx
        return (0,)


@pytest.fixture
def contexts(monkeypatch):
    def make(current):
        fake = FakeContexts(current)
        monkeypatch.setattr(runtime, "_ctx_fns", lambda: (fake.get, fake.set))
        return fake
    return make


def test_call_in_the_current_context_switches_nothing(contexts):
    fake = contexts(current=7)
    assert runtime._in_context(7, lambda a, b: (fake.current, a + b), 1, 2) == (7, 3)
    assert fake.sets == []


@pytest.mark.parametrize("own", [3, 0], ids=["another device's", "none"])
def test_call_elsewhere_runs_in_the_device_context_and_restores_the_thread_s(contexts, own):
    fake = contexts(current=own)
    assert runtime._in_context(7, lambda: fake.current) == 7
    assert fake.current == own and fake.sets == [7, own]


def test_error_restores_the_thread_s_context(contexts):
    fake = contexts(current=3)

    def fail():
        raise RuntimeError("driver error")
    with pytest.raises(RuntimeError, match="driver error"):
        runtime._in_context(7, fail)
    assert fake.current == 3

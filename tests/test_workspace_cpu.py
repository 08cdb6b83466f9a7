"""The fused kernels' kept buffers (fullfuse/workspace.py) without a GPU: the stream, the thread and capture decide
which buffer a call gets (the stream query, the capture query and the allocation faked)."""
import threading

import pytest
import torch

from fullfuse import launch, workspace


@pytest.fixture
def fake_gpu(monkeypatch):
    state = {"stream": 7, "capturing": False, "fresh": [], "kept": []}

    def fresh(index, size, zero):
        state["fresh"].append((index, size, zero))
        return torch.zeros(size, dtype=torch.uint8) if zero else torch.empty(size, dtype=torch.uint8)

    def kept(index, size, zero, stream):
        assert stream == state["stream"] + 100 * index   # made (and later freed) on the stream it serves
        state["kept"].append((index, size, zero))
        return torch.zeros(size, dtype=torch.uint8) if zero else torch.empty(size, dtype=torch.uint8)

    monkeypatch.setattr(launch, "stream_and_capturing", lambda index: (state["stream"] + 100 * index,
                                                                       state["capturing"]))
    monkeypatch.setattr(workspace, "_fresh", fresh)   # per call, under capture: torch's (the graph's pool)
    monkeypatch.setattr(workspace, "_kept", kept)     # kept across calls: the driver's, never a graph pool's
    monkeypatch.setattr(workspace, "_zeroed", {})
    monkeypatch.setattr(workspace, "_scratch", threading.local())
    return state


def test_zeroed_buffer_kept_per_device_and_stream(fake_gpu):
    a = workspace.buffer(0, 1000)
    assert workspace.buffer(0, 1000) is a and workspace.buffer(0, 500) is a       # kept, reused when large enough
    assert fake_gpu["kept"] == [(0, 1000, True)] and not fake_gpu["fresh"]         # zeroed once, when made
    fake_gpu["stream"] = 8
    b = workspace.buffer(0, 1000)
    assert b is not a                                                               # another stream: its own
    assert workspace.buffer(1, 1000) is not b                                       # another device: its own
    fake_gpu["stream"] = 7
    bigger = workspace.buffer(0, 4000)
    assert bigger is not a and bigger.numel() == 4000 and fake_gpu["kept"][-1] == (0, 4000, True)
    assert workspace.buffer(0, 1000) is bigger
    assert workspace.buffer(0, 0) is None


def test_zeroed_buffer_shared_by_threads_of_one_stream(fake_gpu):
    """Launches of one stream never overlap, and the kernels leave the buffer zero: threads share it."""
    mine = workspace.buffer(0, 256)
    seen = []
    t = threading.Thread(target=lambda: seen.append(workspace.buffer(0, 256)))
    t.start()
    t.join()
    assert seen[0] is mine


def test_scratch_buffer_per_thread(fake_gpu):
    """A scratch buffer is written by one launch and read by the next of the same call: threads on one stream
    interleave their launches, so each has its own; it is never zeroed (contents undefined)."""
    mine = workspace.buffer(0, 256, workspace.PACKED)
    assert workspace.buffer(0, 256, workspace.PACKED) is mine
    assert fake_gpu["kept"] == [(0, 256, False)]
    seen = []
    t = threading.Thread(target=lambda: seen.append(workspace.buffer(0, 256, workspace.PACKED)))
    t.start()
    t.join()
    assert seen[0] is not mine
    assert workspace.buffer(0, 256) is not mine                                     # purposes never share
    assert workspace.buffer(0, 256, workspace.PARTIALS) is not mine


def test_capture_gets_a_fresh_buffer_every_call(fake_gpu):
    """Under CUDA-graph capture nothing kept is handed out: the graph owns a fresh buffer, zeroed inside it."""
    kept = workspace.buffer(0, 512)
    fake_gpu["capturing"] = True
    one, two = workspace.buffer(0, 512), workspace.buffer(0, 512, workspace.PACKED)
    assert one is not kept and two is not kept and one is not workspace.buffer(0, 512)
    assert fake_gpu["fresh"] == [(0, 512, True), (0, 512, False), (0, 512, True)] and len(fake_gpu["kept"]) == 1
    fake_gpu["capturing"] = False
    assert workspace.buffer(0, 512) is kept                                         # capture changed nothing kept


def test_release_drops_kept_buffers(fake_gpu):
    """fullfuse.empty_cache() frees the kept buffers; the next call makes its own again."""
    import fullfuse
    a, b = workspace.buffer(0, 64), workspace.buffer(0, 64, workspace.PACKED)
    fullfuse.empty_cache()
    assert workspace.buffer(0, 64) is not a and workspace.buffer(0, 64, workspace.PACKED) is not b


def test_for_launch_names_the_stream_its_buffers_serve(fake_gpu):
    """The caller launches on the stream ``for_launch`` returns: the one its kept buffers belong to."""
    for stream in (7, 9):
        fake_gpu["stream"] = stream
        got_stream, (buf,) = workspace.for_launch(1, ((256, workspace.ZEROED),))
        assert got_stream == stream + 100 and buf is workspace._zeroed[(1, stream + 100)]


def test_kept_bytes_counts_what_is_kept(fake_gpu):
    """The memory the kept buffers hold (outside torch's allocator, so the benchmarks add it to a call's extra
    memory): every stream's zeroed buffer and this thread's scratch buffers; nothing after empty_cache."""
    workspace.buffer(0, 1000)
    fake_gpu["stream"] = 8
    workspace.buffer(0, 500)
    workspace.buffer(0, 300, workspace.PACKED)
    assert workspace.kept_bytes() == 1800
    workspace.release()
    assert workspace.kept_bytes() == 0


def test_a_threads_kept_answer_goes_stale_when_a_kept_buffer_changes(fake_gpu):
    """Each thread reuses its last answer for (device, stream, wanted) only while no kept buffer was replaced or
    released: a larger zeroed buffer made by another thread, or empty_cache, is what the next call gets."""
    small = ((256, workspace.ZEROED), (128, workspace.PACKED))
    workspace.for_launch(0, small)       # (makes the buffers: an answer made while they change is stale at once)
    first = workspace.for_launch(0, small)[1]
    assert workspace.for_launch(0, small)[1] is first                               # the kept answer
    t = threading.Thread(target=lambda: workspace.buffer(0, 4096))                 # another thread, a larger one
    t.start()
    t.join()
    zeroed, packed = workspace.for_launch(0, small)[1]
    assert zeroed is workspace._zeroed[(0, 7)] and zeroed.numel() == 4096 and packed is first[1]
    workspace.release()
    again = workspace.for_launch(0, small)[1]
    assert again[0] is not zeroed and again[1] is not packed and again[0] is workspace._zeroed[(0, 7)]


def test_kept_answers_per_thread_are_bounded(fake_gpu):
    """A program cycling through ever new streams keeps at most MEMO_LIMIT answers per thread."""
    for stream in range(3 * workspace.MEMO_LIMIT):
        fake_gpu["stream"] = stream
        workspace.for_launch(0, ((64, workspace.PACKED),))
    assert 0 < len(workspace._scratch.memo) <= workspace.MEMO_LIMIT

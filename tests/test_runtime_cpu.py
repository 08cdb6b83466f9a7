"""fullfuse.runtime's context handling and device buffers on CPU (the driver calls faked): a driver call runs with the
device's primary context current and leaves the thread's own current afterwards — torch's current device never
changes, a thread with no context gets none left behind, and an error restores it too."""
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


class _FakeKernel:
    device, _ctx = 1, 7


def _launch_recorder(fake, results):
    """A fake driver launch: records the context it ran in, returns the next of ``results`` ((error,) tuples)."""
    seen = []

    def launch(*args):
        seen.append(fake.current)
        return results[len(seen) - 1]
    return launch, seen


@pytest.mark.parametrize("torch_device, own", [(1, 7), (0, 3), (1, 0)],
                         ids=["on the kernel's device", "on another device", "a thread with no context"])
def test_launch_runs_in_the_kernel_s_context_and_restores_the_thread_s(contexts, monkeypatch, torch_device, own):
    """The direct launch (torch's device is the kernel's) is kept only where it succeeded; a failed one (another
    context current: the driver refuses the handles) is retried in the kernel's context, which ends current nowhere
    but in that call."""
    fake = contexts(current=own)
    monkeypatch.setattr(runtime, "current_device_index", lambda: torch_device)
    wrong = own != 7
    direct = [own] if torch_device == 1 else []
    launch, seen = _launch_recorder(fake, [(201,) if wrong else (0,) for _ in direct] + [(0,)])
    assert runtime._launch_in_context(_FakeKernel(), launch, "args") == (0,)
    assert seen == (direct + [7] if wrong else direct)
    assert fake.current == own


@pytest.mark.parametrize("torch_device, own", [(1, 7), (0, 3), (1, 0)],
                         ids=["on the kernel's device", "on another device", "a thread with no context"])
@pytest.mark.parametrize("dependent", [False, True], ids=["launch", "dependent launch"])
def test_prepared_launches_run_in_the_kernel_s_context(contexts, monkeypatch, torch_device, own, dependent):
    """Kernel.at's and dependent_at's prepared launches keep ``_launch_in_context``'s rule in their own frame: straight
    to the driver where torch's device is the kernel's and that launch succeeds, else in the kernel's context, the
    thread's own current again after."""
    fake = contexts(current=own)
    monkeypatch.setattr(runtime, "current_device_index", lambda: torch_device)
    monkeypatch.setattr(runtime.Kernel, "_config", staticmethod(lambda grid, block, smem: type("C", (), {})()))
    wrong = own != 7
    direct = [own] if torch_device == 1 else []
    launch, seen = _launch_recorder(fake, [(201,) if wrong else (0,) for _ in direct] + [(0,)])
    kernel = _bare_kernel(launch)
    kernel._launch_ex = launch
    prepared = (kernel.dependent_at if dependent else kernel.at)(132, 128, 0)
    prepared(55, runtime.Args())
    assert seen == (direct + [7] if wrong else direct)
    assert fake.current == own


def test_launch_error_in_the_kernel_s_context_is_final(contexts, monkeypatch):
    fake = contexts(current=7)
    monkeypatch.setattr(runtime, "current_device_index", lambda: 1)
    launch, seen = _launch_recorder(fake, [(701,), (701,)])
    assert runtime._launch_in_context(_FakeKernel(), launch) == (701,)
    assert seen == [7, 7]


def _bare_kernel(driver_launch):
    """A runtime.Kernel with the device-free half of its state: device 1, context 7, the driver's launch faked."""
    kernel = object.__new__(runtime.Kernel)
    kernel.device, kernel._ctx, kernel._fn, kernel._launch = 1, 7, "fn", driver_launch
    kernel.variant = type("V", (), {"label": "test kernel"})()
    return kernel


@pytest.mark.parametrize("grid, block, dims", [(132, 128, (132, 1, 1, 128, 1, 1)),
                                               ((4, 5, 6), (32, 4, 1), (4, 5, 6, 32, 4, 1))])
def test_kernel_at_converts_dimensions_once_and_launches_in_context(contexts, monkeypatch, grid, block, dims):
    """Kernel.at(grid, block, smem)(stream, args): the driver gets the three-dim grid and block, the shared memory,
    the stream and the argument array's address; a launch error raises with the kernel's name."""
    contexts(current=7)
    monkeypatch.setattr(runtime, "current_device_index", lambda: 1)
    got = []
    kernel = _bare_kernel(lambda *a: got.append(a) or (0,))
    args = runtime.Args()
    kernel.at(grid, block, 4096)(55, args)
    kernel.launch(grid, block, 4096, args, 55)
    assert got == [("fn", *dims, 4096, 55, args.address, 0)] * 2
    failing = _bare_kernel(lambda *a: (1,))
    monkeypatch.setattr(runtime, "_check", lambda result, what: (_ for _ in ()).throw(RuntimeError(what)))
    with pytest.raises(RuntimeError, match="test kernel"):
        failing.at(grid, block, 0)(55, args)


class _FakeDriver:
    """cuMemAlloc(Async) / cuMemFree(Async) recorded; pools=False: the device has no memory pools."""

    def __init__(self, pools: bool):
        self.pools, self.calls = pools, []

    def cuMemAllocAsync(self, size, stream):
        self.calls.append(("alloc_async", size, stream))
        return (0, 0x1000) if self.pools else (801, None)

    def cuMemAlloc(self, size):
        self.calls.append(("alloc", size))
        return 0, 0x2000

    def cuMemFreeAsync(self, ptr, stream):
        self.calls.append(("free_async", ptr, stream))
        return (0,)

    def cuMemFree(self, ptr):
        self.calls.append(("free", ptr))
        return (0,)


@pytest.mark.parametrize("pools", [True, False], ids=["memory-pools", "no-pools"])
def test_device_buffer_stream_ordered_where_the_device_has_pools(monkeypatch, pools):
    """Kept workspaces come from cuMemAllocAsync on their stream and go back on it; a device without memory pools
    (some virtualised GPUs: CUDA_ERROR_NOT_SUPPORTED) gets cuMemAlloc / cuMemFree instead, never an error."""
    fake = _FakeDriver(pools)
    monkeypatch.setattr(runtime, "_driver", lambda: fake)
    monkeypatch.setattr(runtime, "_primary_context", lambda device: "ctx")
    monkeypatch.setattr(runtime, "_in_context", lambda ctx, fn, *args: fn(*args))
    buf = runtime.DeviceBuffer(0, 4096, 77)
    assert buf.numel() == 4096 and buf.data_ptr() == (0x1000 if pools else 0x2000)
    del buf
    if pools:
        assert fake.calls == [("alloc_async", 4096, 77), ("free_async", 0x1000, 77)]
    else:
        assert fake.calls == [("alloc_async", 4096, 77), ("alloc", 4096), ("free", 0x2000)]


def test_tensor_maps_made_once_per_address_refusals_kept_and_bounded(monkeypatch):
    """runtime.TensorMaps: one geometry's maps keyed by address; the driver is asked once per address (a refusal,
    None, is kept too), and the cache is emptied when full instead of growing."""
    asked = []

    def encode(geometry, address):
        asked.append(address)
        return None if address % 2 else bytes([address % 256]) * 128
    monkeypatch.setattr(runtime, "tensor_map", encode)
    maps = runtime.TensorMaps(("float32", (8, 4), (32,), (8, 4), (1, 1)), limit=3)
    assert maps(16) == bytes([16]) * 128 and maps(16) == bytes([16]) * 128
    assert maps(17) is None and maps(17) is None
    assert asked == [16, 17]
    maps(32), maps(48)            # the fourth address: the cache was full and starts again
    maps(16)
    assert asked == [16, 17, 32, 48, 16]


@pytest.mark.parametrize("cc, want", [((9, 0), "sm_90a"), ((8, 0), "sm_80"), ((8, 6), "sm_86"), ((12, 0), "sm_120"),
                                      ((13, 0), "compute_120"), ((7, 5), None), ((6, 1), None)])
def test_arch_of_is_what_the_gpu_loads_and_refuses_gpus_older_than_the_kernels(monkeypatch, cc, want):
    """The NVRTC target per GPU: its own SASS (Hopper as sm_90a), PTX of the newest known architecture for a GPU this
    NVRTC predates; a GPU older than sm_80 is refused before any compile, with the reason and what runs instead."""
    from cutlass_ops import cache
    monkeypatch.setattr(runtime, "device_props", lambda index: runtime.DeviceProps(*cc, 40, 100 << 10))
    monkeypatch.setattr(runtime._nvrtc, "supported_archs", lambda: (75, 80, 86, 89, 90, 100, 120))
    monkeypatch.setattr(cache, "cubin", lambda *args, **kwargs: pytest.fail("compiled"))
    runtime.arch_of.cache_clear()
    try:
        if want is None:
            with pytest.raises(runtime.KernelUnavailable, match=rf"sm_{cc[0]}{cc[1]}; the kernels need sm_80 .*"
                                                                 r"path='auto' runs PyTorch's ops here"):
                runtime.arch_of(0)
            with pytest.raises(runtime.KernelUnavailable):
                runtime.Kernel(None, 0)
        else:
            assert runtime.arch_of(0) == want
    finally:
        runtime.arch_of.cache_clear()

"""The build environment and the fallback's robustness, on CPU (no nvcc, no GPU needed).

- builder.build / load raise BuildError (never OSError) with the fix for every environment failure: no nvcc, an
  unwritable cache, a failed compile, a library that does not load;
- builds are published by rename: concurrent threads and processes compile an entry once, and the final name never
  shows a half-written file (a fake nvcc writes its output in two halves with a pause between);
- the fallbacks' ``unavailable()`` gives the one-line reason instead of raising, and ``run`` raises UnsupportedError;
- cudnn_conv: one handle per (thread, device), misaligned pointers copied, nothing built or cached under capture;
- pipeline: candidates timed in increasing memory order, the ones that do not fit skipped, the chosen one's result
  kept.
"""
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import fullfuse
from cutlass_ops import builder
from fullfuse import launch
from fullfuse.fallback import conv_act_pool as fallback_a
from fullfuse.fallback import convt_pool_reduce as fallback_b
from fullfuse.fallback import cudnn_conv, pipeline

LIB = "fallback_act_pool"          # a library without CUTLASS: its key needs no nvidia-cutlass package
PAYLOAD = b"not an ELF file " * 4096
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A fresh cache directory and fresh caches of the builder, launch and the fallbacks."""
    cached = (builder.find_nvcc, builder.nvcc_version)
    for fn in cached:
        fn.cache_clear()
    monkeypatch.setattr(builder, "_loaded", {})
    monkeypatch.setattr(launch, "_functions", {})
    monkeypatch.setattr(fallback_a, "_reasons", {})
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("FULLFUSE_NVCC", "CUDACXX"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    for fn in cached:
        fn.cache_clear()


def no_nvcc(monkeypatch):
    monkeypatch.setattr(builder, "find_nvcc", lambda: None)
    builder.nvcc_version.cache_clear()


def fake_nvcc(monkeypatch, tmp_path, pause=0.3, fail=False) -> Path:
    """A stand-in for nvcc: logs each compile, writes half its output, pauses, writes the rest (or fails)."""
    if builder.find_ninja() is None:
        pytest.skip("ninja not installed")
    script = tmp_path / "fake_nvcc"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import sys, time
        args = sys.argv[1:]
        if "--version" in args:
            print("Cuda compilation tools, release 12.4, V12.4.131")
            sys.exit(0)
        out = args[args.index("-o") + 1]
        with open({str(tmp_path / "compiles.log")!r}, "a") as log:
            log.write(out + "\\n")
        payload = {PAYLOAD!r}
        with open(out, "wb") as f:
            f.write(payload[: len(payload) // 2])
            f.flush()
            time.sleep({pause})
            if {fail}:
                sys.exit(1)
            f.write(payload[len(payload) // 2:])
    """))
    script.chmod(0o755)
    monkeypatch.setenv("FULLFUSE_NVCC", str(script))
    builder.find_nvcc.cache_clear()
    builder.nvcc_version.cache_clear()
    return script


def compiles(tmp_path) -> int:
    log = tmp_path / "compiles.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


class Watcher:
    """Polls the final library path while builds run: whenever it exists it must hold the complete file."""

    def __init__(self, path: Path):
        self.path, self.seen, self.torn = path, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                continue
            self.seen += 1
            if data != PAYLOAD:
                self.torn.append(len(data))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_no_nvcc_raises_build_error_with_the_fix(env, monkeypatch):
    no_nvcc(monkeypatch)
    for call in (builder.build, builder.load):
        with pytest.raises(builder.BuildError) as info:
            call(LIB)
        first = str(info.value).splitlines()[0]
        assert "nvcc was not found" in first and "FULLFUSE_CACHE_DIR" in first and "fullfuse build" in first
    assert fullfuse.BuildError is builder.BuildError


def test_no_ninja_raises_build_error(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path)
    monkeypatch.setattr(builder, "find_ninja", lambda: None)
    with pytest.raises(builder.BuildError, match="ninja was not found"):
        builder.build(LIB)


def test_cache_dir_that_is_a_file_raises_build_error(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(builder.BuildError, match="cannot write the kernel cache") as info:
        builder.build(LIB)
    assert "FULLFUSE_CACHE_DIR" in str(info.value).splitlines()[0]
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(blocker))       # the cache dir itself is a file
    with pytest.raises(builder.BuildError, match="cannot write the kernel cache"):
        builder.build(LIB)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only directories")
def test_cache_under_a_read_only_dir_raises_build_error(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(locked / "cache"))
        with pytest.raises(builder.BuildError, match="cannot write the kernel cache"):
            builder.build(LIB)
    finally:
        locked.chmod(0o700)


def test_fallback_unavailable_gives_the_reason_and_run_raises_unsupported(env, monkeypatch):
    no_nvcc(monkeypatch)
    for module in (fallback_a, fallback_b):
        reason = module.unavailable()
        assert reason.startswith(f"fallback kernel library {module.LIB} unavailable: ") and "nvcc" in reason
        assert "\n" not in reason
        with pytest.raises(fullfuse.UnsupportedError, match="fallback path cannot serve"):
            module.run(None, None, None, None, "tf32")          # refused before it looks at its arguments
    calls = []
    monkeypatch.setattr(builder, "build", lambda *a, **k: calls.append(a))
    assert fallback_a.unavailable() == fallback_a.unavailable() and not calls   # cached per process


def test_fallback_unavailable_where_the_cache_is_unwritable(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("FULLFUSE_CACHE_DIR", str(blocker))
    assert "cannot write the kernel cache" in fallback_a.unavailable()


def test_concurrent_threads_compile_once_and_never_show_a_partial_file(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path)
    final = builder.library_path(LIB)
    results, errors = [], []

    def one():
        try:
            results.append(builder.build(LIB, quiet=True))
        except Exception as exc:  # reported below
            errors.append(exc)

    with Watcher(final) as watcher:
        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.05)
    assert not errors and results == [final] * 4
    assert compiles(tmp_path) == 1 and final.read_bytes() == PAYLOAD
    assert watcher.seen and not watcher.torn
    assert not [p for p in final.parent.iterdir() if "partial" in p.name]
    assert (final.parent / builder.SOURCES_KEY).read_text().strip() == builder.sources_key(builder.LIBRARIES[LIB])


def test_concurrent_processes_compile_once_and_never_show_a_partial_file(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path, pause=0.5)
    final = builder.library_path(LIB)
    code = f"import cutlass_ops; print(cutlass_ops.build({LIB!r}, quiet=True))"
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with Watcher(final) as watcher:
        procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=environ, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
        outputs = [p.communicate(timeout=120) for p in procs]
        time.sleep(0.05)
    assert all(p.returncode == 0 for p in procs), outputs
    assert {out.strip() for out, _ in outputs} == {str(final)}
    assert compiles(tmp_path) == 1 and final.read_bytes() == PAYLOAD
    assert watcher.seen and not watcher.torn


def test_failed_compile_leaves_nothing_under_the_final_name(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path, pause=0.0, fail=True)
    final = builder.library_path(LIB)
    with pytest.raises(builder.BuildError, match=f"compiling {LIB} failed"):
        builder.build(LIB, quiet=True)
    assert not final.exists() and not [p for p in final.parent.iterdir() if "partial" in p.name]
    fake_nvcc(monkeypatch, tmp_path, pause=0.0)                  # a working compiler: the entry builds
    assert builder.build(LIB, quiet=True) == final and final.read_bytes() == PAYLOAD


def test_stale_partial_file_is_not_taken_as_up_to_date(env, monkeypatch, tmp_path):
    """A killed compile can leave a partial file newer than the sources; ninja must not skip the rebuild."""
    fake_nvcc(monkeypatch, tmp_path, pause=0.0)
    final = builder.library_path(LIB)
    final.parent.mkdir(parents=True)
    stale = final.with_name(f"{final.stem}.partial-{os.getpid()}-{threading.get_ident()}{final.suffix}")
    stale.write_bytes(b"half")
    assert builder.build(LIB, quiet=True) == final
    assert final.read_bytes() == PAYLOAD and compiles(tmp_path) == 1 and not stale.exists()


def test_prebuilt_entry_serves_a_machine_without_nvcc(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path, pause=0.0)
    built = builder.build(LIB, quiet=True)
    no_nvcc(monkeypatch)
    assert builder.library_path(LIB) == built and builder.build(LIB) == built


def test_a_library_that_does_not_load_is_a_build_error(env, monkeypatch, tmp_path):
    fake_nvcc(monkeypatch, tmp_path, pause=0.0)                  # its "library" is not an ELF file
    with pytest.raises(builder.BuildError, match="cannot load the kernel library"):
        builder.load(LIB)
    assert "cannot load the kernel library" in fallback_a.unavailable()


# --- cudnn_conv ------------------------------------------------------------------------------------------------------

class FakeCudnn:
    def __init__(self):
        self.created = 0

    def create_handle(self):
        self.created += 1
        return object()


def test_cudnn_handles_are_per_thread_and_per_device(monkeypatch):
    import contextlib
    monkeypatch.setattr(cudnn_conv, "_local", threading.local())
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    cudnn = FakeCudnn()
    dev0, dev1 = torch.device("cuda", 0), torch.device("cuda", 1)
    mine = cudnn_conv.handle_for(cudnn, dev0)
    assert cudnn_conv.handle_for(cudnn, dev0) is mine and cudnn_conv.handle_for(cudnn, dev1) is not mine
    other = []
    thread = threading.Thread(target=lambda: other.append(cudnn_conv.handle_for(cudnn, dev0)))
    thread.start()
    thread.join()
    assert other[0] is not mine and cudnn.created == 3


def test_misaligned_tensors_are_copied_to_aligned_memory():
    big = torch.randn(2 * 3 * 5 * 7 + 1)
    x = big[1:].view(2, 5, 7, 3).permute(0, 3, 1, 2)          # channels_last, one element past an aligned start
    assert x.is_contiguous(memory_format=torch.channels_last) and x.data_ptr() % 16
    y = cudnn_conv.aligned(x)
    assert y.data_ptr() % 16 == 0 and y.stride() == x.stride() and torch.equal(y, x)
    z = torch.randn(4, 4)
    assert cudnn_conv.aligned(z) is z


def test_no_plan_is_built_or_cached_under_graph_capture(monkeypatch):
    monkeypatch.setattr(cudnn_conv, "frontend", lambda: object())
    monkeypatch.setattr(launch, "capturing", lambda device: True)
    monkeypatch.setattr(cudnn_conv, "_entries", {})
    built = []
    monkeypatch.setattr(cudnn_conv, "_build", lambda *a: built.append(a))
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    assert cudnn_conv.run("fprop", x, w, (2, 4, 6, 6), (0, 0), (1, 1), (1, 1), "tf32", True) is None
    assert not built and not cudnn_conv._entries


# --- pipeline --------------------------------------------------------------------------------------------------------

def test_autotune_times_in_memory_order_skips_what_does_not_fit_and_keeps_the_chosen_result(monkeypatch):
    mb = 1 << 20
    per_image, n = 4 * mb, 64                                  # whole conv output 256 MB
    monkeypatch.setattr(pipeline, "CANDIDATES", ((8 * mb, False), (32 * mb, True), (1 << 62, False)))
    monkeypatch.setattr(pipeline, "_free_bytes", lambda device: 100 * mb)   # the whole batch does not fit
    timings = {8: 1.0, 64: 0.5}                                # ms by the schedule's peak in MB
    executed = []
    monkeypatch.setattr(pipeline, "_execute", lambda device, spans, overlap, produce, consume: executed.append(
        pipeline.peak_bytes(spans, overlap, per_image) // mb))
    monkeypatch.setattr(pipeline, "_time", lambda device, fn: (fn(), timings[executed[-1]])[1])
    chunk_bytes, overlap, ms = pipeline._autotune(None, n, per_image, lambda a, b: None, lambda y, a, b: None)
    assert executed == [8, 64]              # increasing memory; the 256 MB whole batch > 0.8 * 100 MB is not run
    assert (chunk_bytes, overlap, ms) == (32 * mb, True, 0.5)


def test_autotune_prefers_less_memory_among_the_near_fastest(monkeypatch):
    mb = 1 << 20
    monkeypatch.setattr(pipeline, "CANDIDATES", ((8 * mb, False), (32 * mb, False)))
    monkeypatch.setattr(pipeline, "_free_bytes", lambda device: 1 << 40)
    runs = []
    monkeypatch.setattr(pipeline, "_execute", lambda device, spans, overlap, p, c: runs.append(len(spans)))
    monkeypatch.setattr(pipeline, "_time", lambda device, fn: (fn(), {8: 1.00, 2: 0.99}[runs[-1]])[1])
    # 64 MB of conv output: 8 chunks or 2 chunks
    chunk_bytes, overlap, _ = pipeline._autotune(None, 64, 1 * mb, lambda a, b: None, lambda y, a, b: None)
    assert chunk_bytes == 8 * mb and not overlap                 # 1 % slower, a quarter of the memory
    assert runs == [8, 2, 8]                                     # ... and its result is the one kept


def test_peak_bytes_of_a_schedule():
    assert pipeline.peak_bytes([(0, 3), (3, 6)], True, 10) == 60
    assert pipeline.peak_bytes([(0, 3), (3, 5)], False, 10) == 30
    assert pipeline.peak_bytes([(0, 6)], True, 10) == 60

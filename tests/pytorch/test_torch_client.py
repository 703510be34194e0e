"""PyTorch on ascmem (issue 43): a real client allocates through it.

torch's CPU allocator is replaced by ascmem.torch.install(); each test that
compares runs the same work with torch's own allocator and with ascmem's
and asks for bit-identical results.  What could crash (a close while
tensors live, a failed allocation) runs in a child process."""
import gc
import json
import os
import subprocess
import sys
import threading
import queue

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ninja")  # torch.utils.cpp_extension builds the shim with it

import ascmem  # noqa: E402
import ascmem.torch as at  # noqa: E402
from conftest import MiB, run_child


@pytest.fixture(scope="module")
def dev():
    """The default Device, installed for the module; torch's allocator after it."""
    d = at.install()
    at.uninstall()
    yield d
    at.uninstall()


class on_ascmem:
    """with on_ascmem(dev): torch allocates from dev inside the block."""

    def __init__(self, dev):
        self.dev = dev

    def __enter__(self):
        at.install(self.dev)

    def __exit__(self, *exc):
        at.uninstall()


def from_ascmem(dev, t):
    return _in_device(dev, t.data_ptr())


def a_b(dev, fn):
    """fn() with torch's allocator, then with ascmem's: both results."""
    gc.collect()
    ref = fn()
    with on_ascmem(dev):
        got = fn()
    return ref, got


def assert_identical(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout
        if a.layout != torch.strided:
            a, b = a.to_dense(), b.to_dense()
        if a.is_complex():
            a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
        assert torch.equal(a, b) or (a.is_floating_point() and
                                     torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0)) and
                                     torch.equal(a.isnan(), b.isnan())), "outputs differ"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_identical(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_identical(a[k], b[k])
    else:
        assert a == b or (a != a and b != b)


# ---- install / uninstall ---------------------------------------------------------------

def test_install_routes_new_tensors_and_old_ones_keep_their_free(dev):
    before = torch.ones(1000)
    with on_ascmem(dev):
        assert at.installed() and at.device() is dev
        mine = torch.ones(3000)
        big = torch.ones(4 * MiB)
        assert from_ascmem(dev, mine) and from_ascmem(dev, big)
        assert not from_ascmem(dev, before)
        del before  # torch's tensor is freed by torch's allocator
        held = _core_handed_out(dev)
        assert held >= 2
    theirs = torch.ones(1000)
    assert not from_ascmem(dev, theirs)
    assert mine.sum().item() == 3000 and big.sum().item() == 4 * MiB
    del mine, big  # made by ascmem, freed into it after uninstall
    assert _core_handed_out(dev) == held - 2
    dev.check()


def _in_device(dev, addr):
    try:
        dev.kind_of(addr)
        return True
    except ascmem.InvalidArgumentError:
        return False


def _core_handed_out(dev):
    return ascmem._core._handed_out(dev)


def test_install_refuses_a_device_without_memory():
    with pytest.raises(ascmem.UnsupportedError):
        at.install(ascmem.Device("atlas-a2-training"))  # sim: addresses only
    assert not at.installed()


def test_requested_bytes_are_exact_without_the_callers_size(dev):
    """torch's deleter passes no size: the free reads it from the block."""
    base = at.memory_stats(dev)["requested_bytes.all.current"]
    with on_ascmem(dev):
        ts = [torch.empty(n, dtype=torch.uint8) for n in (1, 31, 33, 1000, 40000, 3 * MiB + 5)]
        assert at.memory_stats(dev)["requested_bytes.all.current"] - base == sum(t.numel() for t in ts)
        del ts
    assert at.memory_stats(dev)["requested_bytes.all.current"] == base


def test_close_and_reset_refuse_while_tensors_live_then_succeed():
    out = run_child("""
        import torch, ascmem, ascmem.torch as at
        d = at.install(ascmem.Device("atlas-a2-training", backend="host", paged=True,
                                     memory=1 << 30, device_id=3))
        x = torch.arange(100000, dtype=torch.int64)
        for call in (d.close, d.reset):
            try:
                call()
                raise SystemExit("not refused")
            except ascmem.InUseError as e:
                assert "handed out" in str(e)
        assert x.sum().item() == sum(range(100000))   # still readable: nothing was unmapped
        at.uninstall()
        del x
        d.reset(); d.close()
        print("ok")
    """, timeout=300).stdout
    assert out.startswith("ok")


def test_a_device_collected_while_tensors_live_keeps_their_memory():
    """Interpreter exit may collect the Device before the last tensors: their
    memory stays for their frees (a leak), never a use after free."""
    out = run_child("""
        import gc, torch, ascmem, ascmem.torch as at
        from ascmem import pluggable as pl
        d = at.install(ascmem.Device("atlas-a2-training", backend="host", paged=True,
                                     memory=1 << 30))
        x = torch.ones(1 << 20)
        at.uninstall()
        at._state.last = at._state.device = None       # every reference to d dropped
        at._state.index.clear(); pl._configured.clear()
        del d; gc.collect()
        x.add_(1)
        assert x.sum().item() == 2 * (1 << 20)
        del x
        print("ok")
    """, timeout=300).stdout
    assert out.startswith("ok")


def test_capsule_blocks_count_as_handed_out():
    """The capsule's device calls hand blocks out to C too (issue 43, 2)."""
    import ctypes
    dev = ascmem.Device("atlas-a2-training", backend="host")
    assert _core_handed_out(dev) == 0
    # the capsule's table: device_malloc and device_free (ascmem_capi.h)
    cap = ascmem._core._C_API
    ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
    ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    table = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"ascmem._core._C_API")
    words = ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p))
    # version+size, then 7 pool functions, pool_of, device_of, device_malloc, device_free
    dmalloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                               ctypes.c_int, ctypes.POINTER(ctypes.c_uint64),
                               ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))(words[11])
    dfree = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint,
                             ctypes.POINTER(ctypes.c_int))(words[12])
    device_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(words[10])  # needs the GIL
    d = device_of(dev)
    addr, kind, ev = ctypes.c_uint64(), ctypes.c_int(), ctypes.c_int()
    assert dmalloc(d, 4096, 0, 0, ctypes.byref(addr), ctypes.byref(kind), ctypes.byref(ev)) == 0
    assert _core_handed_out(dev) == 1
    with pytest.raises(ascmem.InUseError):
        dev.close()
    assert dfree(d, addr.value, 0x13, ctypes.byref(kind)) == 0  # aclrtFree's kinds
    assert _core_handed_out(dev) == 0
    dev.close()
    # refused at the gate, before any block is taken or marked (allocation and
    # mark are one pass of the gate, so a close cannot fall between them)
    addr.value = 7
    assert dmalloc(d, 4096, 0, 0, ctypes.byref(addr), ctypes.byref(kind), ctypes.byref(ev)) != 0
    assert addr.value == 0 and kind.value == -1 and _core_handed_out(dev) == 0


def test_a_failed_allocation_tells_torch_why():
    out = run_child("""
        import torch, ascmem, ascmem.torch as at
        d = ascmem.Device("atlas-a2-training", backend="host", paged=True, memory=1 << 30,
                          limit=64 << 20)
        at.install(d)
        try:
            torch.empty(256 << 20, dtype=torch.uint8)
            raise SystemExit("no error")
        except torch.OutOfMemoryError as e:
            assert "limit" in str(e), str(e)
        x = torch.ones(10)            # the device still serves
        del x
        d.close()                     # nothing handed out: allowed, torch still installed
        try:
            torch.ones(10)            # closed: the allocation says so, no crash
            raise SystemExit("no error")
        except RuntimeError as e:
            assert "closed" in str(e), str(e)
        at.uninstall()
        assert torch.ones(10).sum().item() == 10
        print("ok")
    """, timeout=300).stdout
    assert out.startswith("ok")


# ---- real models -------------------------------------------------------------------------

def _cnn_step():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(8, 3, 32, 32)
    y = torch.randint(0, 10, (8,))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in m.parameters()]


def _transformer_step():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    m = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(4, 16, 64)
    out = []
    for _ in range(2):
        opt.zero_grad()
        y = m(x)
        y.pow(2).mean().backward()
        opt.step()
        out.append(y.detach().clone())
    with torch.no_grad():
        out.append(m.eval()(x))
    return out, [p.detach().clone() for p in m.parameters()]


@pytest.mark.parametrize("step", [_cnn_step, _transformer_step], ids=["cnn", "transformer"])
def test_training_steps_are_bit_identical(dev, step):
    ref, got = a_b(dev, step)
    assert_identical(ref, got)
    dev.check()


def test_serving_loop_frees_on_another_thread(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 32))
    inputs = [torch.randn(1 + i % 7, 128) for i in range(60)]

    def serve():
        done = queue.Queue()
        sums = []

        def consumer():  # frees what the server thread made
            while True:
                item = done.get()
                if item is None:
                    return
                sums.append(item.sum().item())
                del item

        t = threading.Thread(target=consumer)
        t.start()
        outs = []
        with torch.no_grad():
            for x in inputs:
                y = model(x)
                outs.append(y.clone())
                done.put(y)
                del y
        done.put(None)
        t.join()
        return outs, sums

    held = _core_handed_out(dev)
    ref, got = a_b(dev, serve)
    assert_identical(ref, got)
    gc.collect()
    assert _core_handed_out(dev) <= held + 2 * len(inputs)  # the outs kept above only
    del got
    gc.collect()
    assert _core_handed_out(dev) == held
    dev.check()


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.arange(i * 1000, (i + 1) * 1000, dtype=torch.float64) ** 2


def test_dataloader_workers_with_fork(dev):
    def load():
        dl = torch.utils.data.DataLoader(_Squares(), batch_size=4, num_workers=2,
                                         multiprocessing_context="fork")
        return [b.sum() for b in dl]

    ref, got = a_b(dev, load)
    assert_identical(ref, got)


# ---- the test databases that ship with torch -----------------------------------------------

# ops whose outputs are not a function of their inputs: uninitialised memory,
# or results that vary with buffer addresses under torch's own allocator too
_NOT_COMPARABLE = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                   "empty_permuted", "linalg.lstsq", "nn.functional.dropout", "bernoulli",
                   "normal", "uniform", "multinomial", "randint", "randn", "rand"}
_OPS_SAMPLE = 40       # every len(op_db) // _OPS_SAMPLE-th OpInfo
_MODULES_SAMPLE = 30


def _op_sample():
    pytest.importorskip("expecttest")  # torch.testing._internal needs it
    from torch.testing._internal.common_methods_invocations import op_db
    step = max(1, len(op_db) // _OPS_SAMPLE)
    return [op for op in op_db[::step] if op.name not in _NOT_COMPARABLE]


def _module_sample():
    pytest.importorskip("expecttest")
    from torch.testing._internal.common_modules import module_db
    step = max(1, len(module_db) // _MODULES_SAMPLE)
    return list(module_db[::step])


def _detach(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return [_detach(v) for v in x]
    return x


def _run_op(op):
    """Forward (and float32 gradients where the op has them) of the op's
    first samples, seeded."""
    torch.manual_seed(0)
    out = []
    grad = op.supports_autograd and torch.float32 in op.supported_dtypes("cpu")
    dtype = torch.float32 if torch.float32 in op.supported_dtypes("cpu") else \
        sorted(op.supported_dtypes("cpu"), key=str)[0]
    for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=grad)):
        if i >= 3:
            break
        torch.manual_seed(i)
        y = op(s.input, *s.args, **s.kwargs)
        out.append(_detach(y))
        tensors = [t for t in (y if isinstance(y, (list, tuple)) else [y])
                   if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
        if grad and tensors:
            inputs = [t for t in [s.input, *s.args] if isinstance(t, torch.Tensor) and t.requires_grad]
            if inputs:
                gs = torch.autograd.grad(sum(t.sum() for t in tensors), inputs, allow_unused=True)
                out.append([_detach(g) for g in gs])
    return out


def test_op_db_sample_is_bit_identical(dev):
    ops = _op_sample()
    compared = 0
    for op in ops:
        try:
            ref = _run_op(op)
        except Exception:  # a sample torch's own allocator cannot run either
            continue
        with on_ascmem(dev):
            got = _run_op(op)
        assert_identical(ref, got), op.name
        compared += 1
    assert compared >= len(ops) // 2
    dev.check()


def _run_module(info):
    out = []
    torch.manual_seed(0)  # the inputs are random
    inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                     training=True)
    for i, mi in enumerate(inputs[:2]):
        if mi.forward_input is None:
            continue
        torch.manual_seed(i)
        m = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs)
        m.train()
        torch.manual_seed(i)
        y = m(*mi.forward_input.args, **mi.forward_input.kwargs)
        out.append(_detach(y))
        ys = [t for t in (y if isinstance(y, (list, tuple)) else [y])
              if isinstance(t, torch.Tensor) and t.requires_grad]
        if ys:
            sum(t.sum() for t in ys).backward()
            out.append([_detach(p.grad) for p in m.parameters() if p.grad is not None])
    return out


def test_module_db_sample_is_bit_identical(dev):
    mods = _module_sample()
    compared = 0
    for info in mods:
        try:
            ref = _run_module(info)
        except Exception:
            continue
        with on_ascmem(dev):
            got = _run_module(info)
        assert_identical(ref, got), info.name
        compared += 1
    assert compared >= len(mods) // 2
    dev.check()


# ---- tags, sleep and wake -----------------------------------------------------------------

def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_sleep_and_wake_keep_data_ptr_and_outputs(dev):
    with on_ascmem(dev):
        torch.manual_seed(0)
        with at.use_tag("weights") as wdev:
            model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                        torch.nn.Linear(2048, 512))
        assert all(from_ascmem(wdev, p) for p in model.parameters())
        x = torch.randn(4, 1024)
        assert not from_ascmem(wdev, x)  # outside the block: the default Device
        with torch.no_grad():
            ref = model(x)
        ptrs = [p.data_ptr() for p in model.parameters()]
        weights = sum(p.numel() * 4 for p in model.parameters())
        before = _rss()
        released = at.sleep("weights", keep=True)
        assert released >= weights - 4 * MiB
        assert before - _rss() >= weights - 8 * MiB      # RSS follows
        assert at.tags()["weights"]
        mapped = at.wake("weights")
        assert mapped == released
        assert [p.data_ptr() for p in model.parameters()] == ptrs
        with torch.no_grad():
            assert_identical(ref, model(x))
        del model
    gc.collect()
    wdev.check()


def test_ca_mem_allocator_api(dev):
    with on_ascmem(dev):
        alloc = at.CaMemAllocator.get_instance()
        assert at.CaMemAllocator.get_instance() is alloc
        with alloc.use_memory_pool(tag="kv"):
            kv = torch.full((1 << 20,), 3.0)
        with alloc.use_memory_pool():
            w = torch.full((1 << 20,), 5.0)
        assert alloc.get_current_usage() >= 8 * MiB
        kv_ptr, w_ptr = kv.data_ptr(), w.data_ptr()
        alloc.sleep(offload_tags=("default",))   # "kv" is discarded, "default" kept
        alloc.wake_up()
        assert (kv.data_ptr(), w.data_ptr()) == (kv_ptr, w_ptr)
        assert torch.equal(w, torch.full((1 << 20,), 5.0))
        assert kv.sum().item() == 0.0  # discarded: comes back as fresh pages
        del kv, w


def test_torch_vocabulary(dev):
    with on_ascmem(dev):
        at.reset_peak_memory_stats()
        base = at.memory_allocated()
        x = torch.empty(8 * MiB, dtype=torch.uint8)
        assert at.memory_allocated() - base >= 8 * MiB
        assert at.max_memory_allocated() >= at.memory_allocated()
        assert at.memory_reserved() >= at.memory_allocated()
        assert "Allocated memory" in at.memory_summary()
        del x
        assert at.memory_allocated() == base
        at.empty_cache()


# ---- giving memory back, profiler ---------------------------------------------------------

def test_rss_after_freeing_1_gib_is_close_to_torchs():
    out = run_child("""
        import torch, ascmem.torch as at
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        def churn():
            base = rss()
            xs = [torch.ones(4 << 20) for _ in range(64)]   # 64 x 16 MiB, touched
            del xs
            return rss() - base
        torch_left = churn()
        at.install()
        ascmem_left = churn()
        print(torch_left, ascmem_left)
    """, timeout=300).stdout
    torch_left, ascmem_left = map(int, out.split())
    assert ascmem_left <= torch_left + 64 * MiB, (torch_left, ascmem_left)


def test_profiler_trace_of_a_model_on_ascmem_plans(dev, tmp_path):
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    with on_ascmem(dev):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for _ in range(3):
                m(torch.randn(64, 256)).sum().backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    assert len(events) >= 20
    ours = sum(_in_device(dev, e["args"]["Addr"]) for e in events)
    assert ours >= len(events) * 0.9  # a few from before the block: torch's own
    r = subprocess.run([sys.executable, "-m", "ascmem", "plan", str(path), "--device", "cpu", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report


def test_bench_torch_smoke():
    """`ascmem bench --torch` runs (one workload, a few steps; timings are not judged)."""
    from ascmem.torch import bench
    res = bench.run(steps=1, warmup=0, names=["mlp_serving"])
    assert res["mlp_serving"]["ascmem_ms"] > 0 and res["mlp_serving"]["torch_ms"] > 0
    assert not at.installed()

"""PyTorch allocates through ascmem, in one line.

    import ascmem.torch
    dev = ascmem.torch.install()        # torch's CPU tensors now come from dev
    ...
    ascmem.torch.uninstall()            # new ones from torch's allocator again

CPU (this machine): a C++ shim, shipped with ascmem and compiled against
the torch in use on first use (cached), replaces torch's CPU allocator
through ``c10::SetAllocator``.  Tensors keep the free they were made with,
so those made before install() or after uninstall() keep working either
way.  The default Device is a paged host Device sized to the machine, which
gives idle pages back to the OS on its own (RELEASE_THRESHOLD).

NPU (torch_npu): install(device) with a Device on the acl backend goes
through torch_npu's NPUPluggableAllocator and change_current_allocator
(ascmem.pluggable); torch_npu is not available where ascmem is tested, so
that path has not been run.

Also: routing by tag (use_tag), sleep/wake of real tensors (sleep, wake),
vLLM-ascend's allocator API (CaMemAllocator) and torch's memory vocabulary
(memory_stats, memory_allocated, ...).  See docs/TORCH.md.
"""

import contextlib
import ctypes
import os
import tempfile
import threading
from typing import Dict, Hashable, Iterator

import torch  # absolute: the real torch, never this package

import ascmem
from ascmem import _core
from ascmem import pluggable as _pl
from ascmem import stats as _stats
from ascmem.errors import InvalidArgumentError, UnsupportedError

__all__ = ["install", "uninstall", "installed", "device", "use_tag", "sleep", "wake", "tags",
           "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats", "empty_cache", "memory_summary",
           "CaMemAllocator", "default_device", "RELEASE_THRESHOLD", "RELEASE_THRESHOLD_MAX", "FIRST_INDEX"]

# Free pages each kind of the default Device keeps mapped for reuse at
# least; beyond them a free gives pages back to the OS at once, as glibc
# does for torch's large tensors the first time (its mmap threshold).  Two
# kinds hold device blocks (huge pages above 1 MiB, normal below), so after
# a first large free at most twice this stays resident (the target: within
# 64 MiB of torch's allocator after freeing 1 GiB).
RELEASE_THRESHOLD = 48 << 20


def _release_threshold_max(machine):
    """How far the threshold of each kind rises when memory it gave back is
    asked for again (csrc/paging.c, "how much is kept"), as glibc's rises
    once a program frees an mmapped chunk and keeps such memory in its heap
    from then on: a step that frees and allocates its activations again
    stops faulting them in.  An eighth of the machine: what a repeating
    working set may keep resident between its steps, while it repeats (kept
    memory a period of allocations does not need goes back)."""
    return max(RELEASE_THRESHOLD, machine // 8)


# The pluggable functions' device indices used here: 0..31 stay for NPU ids.
FIRST_INDEX = 32
_LAST_INDEX = 63
_PROFILE = "atlas-a2-training"  # a product with virtual memory management: paged works


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.device = None      # the installed Device (None: not installed)
        self.last = None        # the Device installed last (statistics after uninstall)
        self.npu = False        # installed through torch_npu's pluggable allocator
        self.index = {}         # Device -> pluggable index, for every Device ever used here
        self.tag_device = {}    # tag -> Device
        self.sleeping = {}      # tag -> what _sleep_handed_out kept


_state = _State()


def _machine_memory():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


RELEASE_THRESHOLD_MAX = _release_threshold_max(_machine_memory())  # of this machine


def default_device(device_id=0):
    """A Device for torch's CPU tensors: host backend (real memory), paged
    (pages mapped where live blocks are, idle ones given back beyond a
    release threshold that adapts between RELEASE_THRESHOLD and
    RELEASE_THRESHOLD_MAX), sized to the machine's memory."""
    machine = _machine_memory()
    return ascmem.Device(_PROFILE, backend="host", paged=True, memory=machine,
                         release_threshold=RELEASE_THRESHOLD,
                         release_threshold_max=_release_threshold_max(machine), device_id=device_id)


def _register(dev):
    """dev's pluggable index (registers it at a free one the first time).
    Registrations stay: the deleters of tensors made from dev find it there."""
    idx = _state.index.get(dev)
    if idx is not None:
        return idx
    used = set(_state.index.values())
    idx = next((i for i in range(FIRST_INDEX, _LAST_INDEX + 1) if i not in used), None)
    if idx is None:
        raise InvalidArgumentError(f"ascmem.torch: at most {_LAST_INDEX - FIRST_INDEX + 1} "
                                   f"Devices (tags included) can serve torch in one process")
    _pl.configure(dev, idx)
    _state.index[dev] = idx
    return idx


def _capabilities(dev):
    """What dev's backend declares it can do (_core.backends(): holds_memory,
    readable, from_runtime, paging, chunk_alignment): which way torch
    allocates from it follows from these, never from the backend's name."""
    caps = _backend_caps.get(dev.backend)
    if caps is None:
        caps = _backend_caps[dev.backend] = _core.backends()[dev.backend]
    return caps


_backend_caps = {}


def _lib():
    from ascmem.torch import _shim
    return _shim.load()


def install(device: "ascmem.Device | None" = None) -> "ascmem.Device":
    """Makes torch's allocations come from an ascmem Device from now on and
    returns it.  device: a Device on the host backend (CPU tensors), or on
    the acl backend under torch_npu (NPU tensors); None: the Device installed
    last, else a new default_device().
    Installing again with the same device (or None) returns it; another
    device needs uninstall() first."""
    with _state.lock:
        if _state.device is not None:
            if device is None or device is _state.device:
                return _state.device
            raise InvalidArgumentError("ascmem.torch: another Device is installed; uninstall() first")
        dev = device if device is not None else _state.last if _state.last is not None else default_device()
        if not isinstance(dev, ascmem.Device):
            raise InvalidArgumentError(f"install: device must be an ascmem.Device, not {type(dev).__name__}")
        caps = _capabilities(dev)
        if caps["from_runtime"]:  # the Ascend runtime's memory: NPU tensors
            _install_npu(dev)
        elif caps["readable"]:    # memory this process reads and writes: CPU tensors
            lib = _lib()
            lib.ascmem_torch_set_index(_register(dev))
            lib.ascmem_torch_install()
        else:
            raise UnsupportedError(f"install: a Device on the {dev.backend!r} backend has no memory "
                                   f"the CPU can use and is not the Ascend runtime's; use "
                                   f"backend='host' (CPU) or 'acl' (NPU)")
        _state.device = _state.last = dev
        return dev


def _install_npu(dev):
    """torch_npu: ascmem's pluggable functions as the NPU allocator (not run
    here: torch_npu and an Ascend device are not available)."""
    try:
        import torch_npu  # noqa: F401  (absolute)
    except ImportError:
        raise UnsupportedError("install: a Device on the acl backend needs torch_npu") from None
    _pl.configure(dev)
    alloc = torch_npu.npu.NPUPluggableAllocator(_pl.library_path(), _pl.ALLOC, _pl.FREE)
    _pl.set_hooks(alloc.allocator())
    torch_npu.npu.memory.change_current_allocator(alloc)
    _state.npu = True


def uninstall() -> "ascmem.Device | None":
    """New allocations come from torch's own allocator again; tensors made
    through ascmem stay valid and are freed into it.  Returns the Device
    that was installed (None if none was).  torch_npu cannot change its
    allocator back once it has allocated: there this raises
    UnsupportedError."""
    with _state.lock:
        dev = _state.device
        if dev is None:
            return None
        if _state.npu:
            raise UnsupportedError("uninstall: torch_npu keeps the allocator it has allocated with")
        _lib().ascmem_torch_uninstall()
        _state.device = None
        return dev


def installed() -> bool:
    """Whether torch's CPU allocator is ascmem's now."""
    return _state.device is not None


def device() -> "ascmem.Device | None":
    """The installed Device, or None."""
    return _state.device


def _require_installed(call):
    """The installed Device (or, after uninstall(), the one installed last)."""
    dev = _state.device or _state.last
    if dev is None:
        raise InvalidArgumentError(f"{call}: ascmem.torch was never installed (ascmem.torch.install())")
    return dev


# ---- routing by tag ------------------------------------------------------------

def _tag_device(tag):
    """The Device of a tag, made like the default one the first time."""
    try:
        hash(tag)
    except TypeError:
        raise InvalidArgumentError(f"a tag must be hashable (a name), not {type(tag).__name__}") from None
    with _state.lock:
        dev = _state.tag_device.get(tag)
        if dev is None:
            dev = _state.tag_device[tag] = default_device()
        _register(dev)
        return dev


@contextlib.contextmanager
def use_tag(tag: Hashable) -> Iterator["ascmem.Device"]:
    """Within the block, this thread's torch allocations come from the tag's
    Device (one per tag, paged, so sleep() can give its pages back); other
    threads are not affected.  Frees go to whichever Device holds the block,
    inside or outside the block.  Needs install() (CPU)."""
    if _state.device is None or _state.npu:
        raise InvalidArgumentError("use_tag: ascmem.torch is not installed for CPU tensors")
    dev = _tag_device(tag)
    lib = _lib()
    prev = lib.ascmem_torch_use_index(_state.index[dev])
    try:
        yield dev
    finally:
        lib.ascmem_torch_use_index(prev)


def tags():
    """The tags used so far, and whether each is asleep."""
    return {tag: tag in _state.sleeping for tag in _state.tag_device}


class _Spill:
    """Where a sleeping tag's contents wait: a temporary file (in
    $ASCMEM_TORCH_SLEEP_DIR, else tempfile's folder).  A copy in this
    process's memory would hold the resident pages the sleep gives back."""

    def __init__(self):
        self.file = tempfile.TemporaryFile(dir=os.environ.get("ASCMEM_TORCH_SLEEP_DIR"))

    def save(self, addr, size):
        offset = self.file.seek(0, os.SEEK_END)
        self.file.write((ctypes.c_char * size).from_address(addr))
        return offset, size

    def load(self, addr, token):
        offset, size = token
        self.file.seek(offset)
        view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
        done = 0
        while done < size:
            n = self.file.readinto(view[done:])
            if not n:
                raise OSError(f"the sleep file of {addr:#x} ended early")
            done += n


def sleep(tag: Hashable, keep: bool = True) -> int:
    """Gives the memory of the tag's tensors back to the OS while they keep
    their data_ptr(); keep: their contents are saved to a temporary file for
    wake(), False discards them.  Tensors of 32 KiB or less share slabs with
    others and stay resident.  No thread may read, write or free the tag's
    tensors until wake().  Returns the bytes given back."""
    dev = _state.tag_device.get(tag)
    if dev is None:
        raise InvalidArgumentError(f"sleep: no tensors were allocated with tag {tag!r}")
    if tag in _state.sleeping:
        raise InvalidArgumentError(f"sleep: tag {tag!r} is asleep already")
    spill = _Spill() if keep else None
    try:
        released, saved = _core._sleep_handed_out(dev, spill.save if spill else None)
    except BaseException:
        if spill:
            spill.file.close()
        raise
    _state.sleeping[tag] = (saved, spill)
    return released


def wake(tag: Hashable) -> int:
    """Maps the tag's tensors again at the same addresses and puts back what
    sleep(keep=True) saved (discarded contents come back as zeros).  All or
    nothing.  Returns the bytes mapped."""
    if tag not in _state.sleeping:
        raise InvalidArgumentError(f"wake: tag {tag!r} is not asleep")
    saved, spill = _state.sleeping[tag]
    mapped = _core._wake_handed_out(_state.tag_device[tag], saved, spill.load if spill else None)
    del _state.sleeping[tag]
    if spill:
        spill.file.close()
    return mapped


# ---- torch's vocabulary ------------------------------------------------------------

def _devices():
    """The installed Device and every tag's."""
    dev = _require_installed("memory_stats")
    return [dev] + [d for d in _state.tag_device.values() if d is not dev]


def memory_stats(device: "ascmem.Device | None" = None) -> Dict[str, int]:
    """torch.cuda.memory_stats()'s keys for the installed Device (or the one
    given): ascmem.stats.memory_stats."""
    return _stats.memory_stats(_require_installed("memory_stats") if device is None else device)


def memory_allocated(device: "ascmem.Device | None" = None) -> int:
    """Bytes in live blocks (their rounded sizes), as torch.cuda.memory_allocated."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: "ascmem.Device | None" = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: "ascmem.Device | None" = None) -> int:
    """Bytes the Device holds from the OS now (a paged Device: mapped pages)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: "ascmem.Device | None" = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: "ascmem.Device | None" = None) -> None:
    (_require_installed("reset_peak_memory_stats") if device is None else device).reset_peaks()


def empty_cache() -> int:
    """Every Device serving torch gives its idle memory back (Device.empty_cache);
    returns the bytes released.  Not needed for that: a paged Device keeps
    at most RELEASE_THRESHOLD of free pages per kind."""
    return sum(d.empty_cache() for d in _devices())


def memory_summary(device: "ascmem.Device | None" = None) -> str:
    return _stats.memory_summary(_require_installed("memory_summary") if device is None else device)


# ---- vLLM-ascend's sleep-mode allocator ----------------------------------------------

class CaMemAllocator:
    """The API of vLLM-ascend's CaMemAllocator (vllm_ascend/device_allocator/
    camem.py) on ascmem: code written for it runs unchanged.  Allocations in
    use_memory_pool(tag) go to the tag's Device; sleep() gives every tag's
    memory back, keeping the contents of offload_tags; wake_up() maps it
    again at the same addresses."""

    instance = None
    default_tag = "default"

    @staticmethod
    def get_instance():
        if CaMemAllocator.instance is None:
            CaMemAllocator.instance = CaMemAllocator()
        return CaMemAllocator.instance

    def __init__(self):
        install()  # idempotent: the default Device unless one is installed

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        with use_tag(self.default_tag if tag is None else tag):
            yield

    def sleep(self, offload_tags=None):
        """Every awake tag sleeps; tags in offload_tags keep their contents,
        the others' are discarded (vLLM-ascend's rule).  None: ("default",)."""
        if offload_tags is None:
            offload_tags = (self.default_tag,)
        elif isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        for tag in list(_state.tag_device):
            if tag not in _state.sleeping:
                sleep(tag, keep=tag in offload_tags)

    def wake_up(self, tags=None):
        """Wakes the given tags (None: every sleeping tag)."""
        for tag in list(_state.sleeping) if tags is None else tags:
            if tag in _state.sleeping:
                wake(tag)

    def get_current_usage(self):
        """Bytes allocated through the pools (every tag's Device)."""
        return sum(memory_allocated(d) for d in _state.tag_device.values())

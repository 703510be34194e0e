"""Ascend product families and the memory facts ascmem applies to each.

Sources (CANN documentation unless noted):
  [P]  "Memory Management" precautions page (shared/seed/memory-precautions.txt):
       the Atlas 200/300/500 Inference Product reserves huge pages equal to 25% of
       the device's free OS memory, "about 1940 MB" -- so free OS memory is about
       7760 MB; in EP mode huge memory grows and shrinks past the reserve.  The
       Atlas Training Series caches AI CPU operators on the first job after start
       in EP mode, 100-200 MB.  Media memory (acldvppMalloc / hi_mpi_dvpp_malloc)
       may feed model inference; other work should use aclrtMalloc.
  [M]  aclrtMemMallocPolicy: P2P policies not supported on the Atlas 200/300/500
       Inference Product nor the Atlas 200I/500 A2; HUGE1G only on Atlas A2 and A3.
  [A]  aclrtMemAttr: HBM_MEM_HUGE1G supported on Atlas A2/A3 training and inference.
  [W]  acldvppMalloc (CANN 8.3-9.0 C API page aclcppdevg_03_0322, and the pyACL
       dvpp_malloc page): the media address space a process can reach is at most
       16 GB on the Atlas A3, the Atlas A2 and the Atlas inference series (310P).
  [W4] No page gives a figure for the other products.  hicann/driver's DVPP heap
       is 4 GB until the device reports its size, which is 4 GB or 16 GB
       (src/ascend_hal/svm/v2/devmm/devmm_virt_interface.c line 949;
       src/sdk_driver/svm/v2/master/comm/svm_master_dev_capability.c lines
       156-157): ascmem assumes 4 GB for them.
  [H]  Product pages: Atlas 300I (model 3000) carries four Ascend 310 with 8 GB each;
       Atlas 200 DK 8 GB; Atlas 200I DK A2 4 GB; Atlas 300I Pro 24 GB; Atlas 300T
       (Ascend 910) 32 GB HBM; Atlas 800T A2: eight 910B with 64 GB HBM each.
  [S]  Atlas A2/A3 products load a system package of about 300 MB on the first job
       instead of the AI CPU operator cache (CANN release notes / field reports).
  [D]  hi_mpi_dvpp_malloc (pyACL acl.himpi.dvpp_malloc): not supported on the
       Atlas 200/300/500 Inference Product nor the Atlas Training Series Product
       (CANN 8.0 C API page "hi_mpi_dvpp_malloc", aclcppdevg_03_0324, and the
       pyACL dvpp_malloc page, aclpythondevg_01_0416); acldvppMalloc is.
  [V]  Virtual memory management (aclrtReserveMemAddress, aclrtMallocPhysical,
       aclrtMapMem, aclrtUnmapMem, aclrtFreePhysical, aclrtReleaseMemAddress,
       aclrtMemGetAllocationGranularity): Ascend 950PR/950DT, Atlas A3, Atlas A2,
       the Atlas 200I/500 A2 (not in RC mode), the Atlas inference series (310P)
       and the Atlas training series (910); not the Ascend 310 products
       (hicann/runtime at 681ef7610, docs/zh/api_ref/11-04_virtual_memory_management.md:
       the product table under each call, e.g. lines 38-56 for aclrtMallocPhysical
       and 213-231 for aclrtReserveMemAddress; RC mode refused, lines 84, 270, 473).
       The older page docs/api_docs/aclrtReserveMemAddress.md listed A2, A3 and
       950 only; it is gone from the repository.  Where the driver lacks the
       calls the runtime answers 207000 (src/runtime/driver/npu_driver_mem.cc
       lines 334-341; src/runtime/api/api_c.cc line 3664).
  [O]  Stream-ordered memory pools (aclrtMemPoolCreate ... aclrtMemPoolTrimTo):
       Atlas A2 training and inference series only (hicann/runtime,
       docs/zh/api_ref/11-10_ordered_stream_memory_allocation.md, the product
       table under each call).
  [X]  External allocator (aclrtAllocatorRegister, aclrtAllocatorGetByStream,
       aclrtAllocatorUnregister): every product here but the Atlas 200I/500 A2
       (hicann/runtime, docs/zh/api_ref/11-08_custom_memory_allocator.md, the
       product table under each call).
  [C]  hicann/runtime src/platform/platform_config/cann/*.ini, [SoCInfo]
       memory_size: Ascend310P1/P3/P5/P7 24000000000 (line 21); Ascend910B1-B3
       68719476736 and Ascend910B4 34359738368 (line 23); Ascend910_93xx (A3)
       68719476736 (line 23).
  [R]  RC mode is the Atlas 200 AI accelerator module's (and the 200 DK's)
       PCIe root-complex mode; the 300I and 500 run EP (CANN installation
       guide, "Atlas 200 (RC scenario)", instg_000006 / instg_0004).
  [G]  hicann/runtime docs/zh/api_ref/11_memory_management.md line 12: on the
       Atlas A2 and A3 the system reserves huge pages in advance (query them with
       aclrtGetMemInfo); in EP mode the first job loads a system package of about
       300 MB, released only when the device restarts.
Numbers per device are per chip (one Ascend device id).  A figure no source
above gives is marked "assumption" in its profile's source string.
"""

import dataclasses
import sys

from ascmem.errors import InvalidArgumentError
from ascmem.rules import GiB, MiB

MEDIA_WINDOW = 16 * GiB      # [W]
MEDIA_WINDOW_4G = 4 * GiB    # [W4], an assumption


# keyword-only where the language allows it (3.10+): a record reads as named
# facts, and a fact left out takes its default rather than the next one's place
_RECORD = {"frozen": True, **({"kw_only": True} if sys.version_info >= (3, 10) else {})}


@dataclasses.dataclass(**_RECORD)
class Profile:
    """One product: every fact and capability ascmem applies to it is a field
    here, so a new product is one record in _PROFILES.  Capabilities default
    to absent: a record grants only what its sources say."""
    name: str
    title: str
    memory_type: str             # "DDR" or "HBM"
    memory: int                  # device memory per chip, bytes [H]
    free_os_memory: int          # memory left for applications, bytes
    source: str                  # where each figure comes from (the [X] marks above)
    aliases: tuple = ()
    modes: tuple = ("EP",)       # "EP", "RC"; the first is the default
    huge_reserve_fraction: float = 0.0  # share of free OS memory reserved for huge pages [P]
    aicpu_cache: tuple = (0, 0)  # (min, max) bytes taken by the first job, or (0, 0) [P]
    first_job_package: int = 0   # bytes of system package loaded by the first job [S]
    media_window: int = MEDIA_WINDOW_4G  # media (DVPP) address space per process [W] [W4]
    p2p: bool = False            # P2P policies supported [M]
    huge1g: bool = False         # 1 GiB huge pages [M][A]
    himpi: bool = False          # hi_mpi_dvpp_malloc exists [D]
    virtual_memory: bool = False  # reserve address space and map physical memory in granules,
    #                               so paged pools are possible, in EP mode [V]
    virtual_memory_in_rc: bool = False  # ... and in RC mode too [V]
    stream_pools: bool = False   # aclrtMemPoolCreate and the other SOMA calls [O]
    external_allocator: bool = False  # aclrtAllocatorRegister [X]
    huge_pages_reserved_in_advance: bool = False  # the system reserves huge pages ahead [G]

    @property
    def default_mode(self):
        return self.modes[0]

    def virtual_memory_in(self, mode):
        """Whether the virtual memory calls work in this mode (the Atlas
        200I/500 A2 refuses them in RC mode [V])."""
        return self.virtual_memory and (mode != "RC" or self.virtual_memory_in_rc)

    @property
    def media_window_source(self):
        """Where the media window figure comes from [W] [W4]."""
        if self.media_window == MEDIA_WINDOW:
            return "documented for this product (acldvppMalloc, CANN API reference)"
        return ("an assumption: no page gives it for this product; the driver's DVPP heap is "
                "4 GB until the device reports 4 or 16 GB (hicann/driver)")

    def huge_reserve(self, free_os_memory=None):
        """Huge-page reserve: 25% of free OS memory, rounded down to 2 MiB [P]."""
        free = self.free_os_memory if free_os_memory is None else free_os_memory
        return int(free * self.huge_reserve_fraction) // (2 * MiB) * (2 * MiB)


_PROFILES = [
    Profile(name="atlas-inference", title="Atlas 300I / 500 Inference Product (Ascend 310)",
            aliases=("atlas-300i", "atlas-500"), memory_type="DDR",
            memory=8 * GiB, free_os_memory=7760 * MiB, huge_reserve_fraction=0.25,
            external_allocator=True,
            source="[P] reserve rule; [H] 8 GB per Ascend 310; free OS memory 7760 MB implied by "
            "the 1940 MB = 25% reserve; [R] EP only; media window [W4] an assumption"),
    Profile(name="atlas-200", title="Atlas 200 AI Accelerator Module / Atlas 200 DK (Ascend 310)",
            aliases=("atlas-200dk",), memory_type="DDR",
            memory=8 * GiB, free_os_memory=7760 * MiB, huge_reserve_fraction=0.25,
            modes=("EP", "RC"), external_allocator=True,
            source="[P] reserve rule; [H] 8 GB; [R] EP and RC; media window [W4] an assumption"),
    Profile(name="atlas-training", title="Atlas Training Series Product (Ascend 910)",
            aliases=("atlas-300t",), memory_type="HBM", memory=32 * GiB,
            free_os_memory=32 * GiB, aicpu_cache=(100 * MiB, 200 * MiB), p2p=True,
            virtual_memory=True, external_allocator=True,
            source="[P] AI CPU cache 100-200 MB; [H] 32 GB HBM; media window [W4] an "
            "assumption"),
    Profile(name="atlas-inference-series", title="Atlas Inference Series Product (Ascend 310P)",
            aliases=("atlas-300i-pro",), memory_type="DDR", memory=24_000_000_000,
            free_os_memory=24_000_000_000, media_window=MEDIA_WINDOW, p2p=True, himpi=True,
            virtual_memory=True, external_allocator=True,
            source="[C] 24,000,000,000 bytes; [M] P2P supported; [W]"),
    Profile(name="atlas-300i-duo", title="Atlas 300I Duo (two Ascend 310P, one device id each)",
            memory_type="DDR", memory=48 * GiB, free_os_memory=48 * GiB,
            media_window=MEDIA_WINDOW, p2p=True, himpi=True, virtual_memory=True,
            external_allocator=True,
            source="[H] 96 GB per card, 48 GB per chip (binary GiB an assumption: the platform "
            "config gives 310P chips 24,000,000,000 bytes); rules as the inference series"),
    Profile(name="atlas-a2-training", title="Atlas A2 Training Series Product (Ascend 910B)",
            aliases=("atlas-800t-a2",), memory=64 * GiB, free_os_memory=64 * GiB,
            stream_pools=True, memory_type="HBM", first_job_package=300 * MiB,
            media_window=MEDIA_WINDOW, p2p=True, huge1g=True, himpi=True, virtual_memory=True,
            external_allocator=True, huge_pages_reserved_in_advance=True,
            source="[C] 64 GiB HBM per 910B1-B3; [G] ~300 MB system package, huge pages reserved "
            "in advance; [M][A]; [W]"),
    Profile(name="atlas-a2-910b4", title="Atlas A2 Series Product with the Ascend 910B4 (32 GB)",
            aliases=("ascend-910b4",), memory=32 * GiB, free_os_memory=32 * GiB,
            stream_pools=True, memory_type="HBM", first_job_package=300 * MiB,
            media_window=MEDIA_WINDOW, p2p=True, huge1g=True, himpi=True, virtual_memory=True,
            external_allocator=True, huge_pages_reserved_in_advance=True,
            source="[C] 34,359,738,368 bytes; [G]; [M][A]; [W]"),
    Profile(name="atlas-a2-inference", title="Atlas A2 Inference Product (Atlas 800I A2)",
            aliases=("atlas-800i-a2",), memory=64 * GiB, free_os_memory=64 * GiB,
            stream_pools=True, memory_type="HBM", first_job_package=300 * MiB,
            media_window=MEDIA_WINDOW, p2p=True, huge1g=True, himpi=True, virtual_memory=True,
            external_allocator=True, huge_pages_reserved_in_advance=True,
            source="[C] 64 GiB HBM; [G]; [M][A]; [W]"),
    Profile(name="atlas-200i-a2", title="Atlas 200I/500 A2 Inference Product",
            aliases=("atlas-500-a2",), memory_type="DDR", memory=4 * GiB, free_os_memory=4 * GiB,
            modes=("RC", "EP"), himpi=True, virtual_memory=True,
            source="[H] Atlas 200I DK A2 4 GB; [M] no P2P, no HUGE1G; [V] no virtual memory in "
            "RC mode; [X] no external allocator; media window [W4] an assumption"),
    Profile(name="atlas-a3", title="Atlas A3 Training/Inference Series Product",
            aliases=("atlas-a3-training", "atlas-a3-inference"), memory=64 * GiB,
            free_os_memory=64 * GiB, memory_type="HBM", first_job_package=300 * MiB,
            media_window=MEDIA_WINDOW, p2p=True, huge1g=True, himpi=True, virtual_memory=True,
            external_allocator=True, huge_pages_reserved_in_advance=True,
            source="[C] 64 GiB per device id (Ascend910_93xx); [G]; [M][A]; [W]"),
]

_BY_NAME = {}
for _p in _PROFILES:
    for _n in (_p.name,) + _p.aliases:
        _BY_NAME[_n] = _p


def names():
    """Canonical profile names."""
    return [p.name for p in _PROFILES]


def get(name):
    """The profile for a name or alias; unknown names list the known ones."""
    if isinstance(name, Profile):
        return name
    try:
        return _BY_NAME[str(name).lower()]
    except KeyError:
        known = ", ".join(sorted(_BY_NAME))
        raise InvalidArgumentError(f"unknown product {name!r}; known: {known}") from None


@dataclasses.dataclass(frozen=True)
class Layout:
    """A device's physical budget and the size of each kind's first chunk,
    worked out from its profile (the arithmetic of Device's constructor)."""
    reserve: int       # huge-page reserve [P]
    shared: int        # the rest of the memory applications get
    huge_grows: bool   # EP: huge pages grow past the reserve, out of `shared`
    limit: int         # cap on huge + normal + runtime memory (0: none)
    aicpu_cache: int   # bytes the first job takes for AI CPU operators
    sizes: tuple       # per MemKind value: bytes of the kind's first chunk (0: no such kind)


def layout(profile, mode, *, memory=None, free_os_memory=None, aicpu_cache=None,
           host_memory=4 * GiB, limit=None, runtime_sized=False):
    """The Layout of a device of this profile in this mode; arguments in bytes,
    None for the profile's.  runtime_sized: chunks come from the Ascend
    runtime, which gives what the budget allows, not address space, so the
    pools start smaller (half the reserve or application memory each)."""
    mem = profile.memory if memory is None else memory
    if free_os_memory is not None:
        free_os = free_os_memory
    elif memory is None:
        free_os = profile.free_os_memory
    else:
        free_os = mem * profile.free_os_memory // profile.memory
    if free_os > mem or free_os < 8 * MiB:
        raise InvalidArgumentError("free OS memory must be at least 8 MiB and at most the "
                                   "device memory")
    lo, hi = profile.aicpu_cache
    if aicpu_cache is not None and (not hi or not lo <= aicpu_cache <= hi):
        raise InvalidArgumentError(f"aicpu_cache must lie in {lo}-{hi} bytes for {profile.name}"
                                   if hi else f"{profile.name} has no AI CPU operator cache")
    app = free_os // (2 * MiB) * (2 * MiB)
    reserve = profile.huge_reserve(free_os)
    grows = mode == "EP"
    sizes = [app if grows else reserve,                           # HUGE
             app - reserve,                                       # NORMAL
             min(profile.media_window, app),                      # DVPP
             host_memory // 4096 * 4096,                          # HOST
             app // GiB * GiB if profile.huge1g else 0]           # HUGE1G
    if runtime_sized:
        sizes[0] = (reserve or app // 2) // (2 * MiB) * (2 * MiB)
        sizes[1] = (app - sizes[0]) // 2 // 4096 * 4096
        sizes[2] = min(sizes[2], app // 4) // (2 * MiB) * (2 * MiB)
        sizes[3] = min(sizes[3], GiB)
        sizes[4] = 0
    return Layout(reserve, app - reserve, grows, limit or 0,
                  hi if aicpu_cache is None else aicpu_cache, tuple(sizes))


def mode_of(profile, mode):
    """The mode asked for (default: the product's first), checked."""
    from ascmem.errors import UnsupportedError
    mode = profile.default_mode if mode is None else str(mode).upper()
    if mode not in profile.modes:
        raise UnsupportedError(f"{profile.title} has no {mode} mode (it has: "
                               f"{', '.join(profile.modes)})")
    return mode


def precautions(profile, mode):
    """The CANN memory precautions that apply to this product in this mode."""
    out = []
    if profile.huge_reserve_fraction:
        reserve = profile.huge_reserve(profile.free_os_memory)
        out.append(
            f"Huge-page reserve: the system sets aside about {reserve // MiB} MB of huge-page "
            f"memory ({profile.huge_reserve_fraction:.0%} of the device's free OS memory); use it "
            "first, e.g. with HUGE_FIRST or HUGE_ONLY allocations.")
        if mode == "EP":
            out.append("EP mode: once the huge-page reserve is used up, huge-page memory grows out "
                       "of the rest of device memory and shrinks again when freed.")
        else:
            out.append("RC mode: huge-page memory never grows past the reserve; HUGE_ONLY requests "
                       "fail once it is used up and HUGE_FIRST ones fall back to normal pages.")
    if profile.aicpu_cache[1] and mode == "EP":
        lo, hi = profile.aicpu_cache
        out.append(
            f"AI CPU operator cache: the first inference or training job after the device starts "
            f"copies the AI CPU operators to the device and keeps them there, taking {lo // MiB}-"
            f"{hi // MiB} MB of device memory until the device is restarted.")  # the seed's figures
    if profile.huge_pages_reserved_in_advance:
        out.append("Huge pages: the system reserves huge-page memory in advance so that it does "
                   "not run short; query what is free with aclrtGetMemInfo before relying on it.")
    if profile.first_job_package:
        out.append(f"The first job loads a system package of about "
                   f"{profile.first_job_package // MiB} MB into device memory; only a device "
                   f"restart releases it.")
    out.append(
        "Media memory: media data processing (DVPP) needs its own allocation calls "
        f"({'acldvppMalloc, hi_mpi_dvpp_malloc' if profile.himpi else 'acldvppMalloc'}); a media "
        "output buffer can be fed straight to model "
        "inference without a copy.")
    out.append(
        f"The media address space is limited ({profile.media_window // GiB} GB per process, "
        f"{profile.media_window_source}): "
        "allocate model weights, workspaces and other non-media buffers with aclrtMalloc / "
        "aclrtMallocHost so that media processing keeps its room.")
    if mode == "RC":
        out.append("RC mode: host and device are one, so aclrtMallocHost memory is device memory "
                   "in normal pages, with no 64-byte start guarantee; each piece cut from it needs "
                   "ALIGN_UP(len, 32) + 32 bytes at a 64-byte start (hicann/runtime "
                   "docs/zh/api_ref/11-02_host_memory_management.md).")
    if not profile.p2p:
        out.append("P2P allocation policies are not supported on this product.")
    return out

"""ascmem plan: will this workload fit on that product, with what headroom,
under which allocator -- asked before deployment, or after an out-of-memory.

The workload (a trace) is measured once per allocator:
  - ascmem: replayed through a Device under each placement the reference
    Device can take (a contiguous Pool's: it is not paged), in each unit of
    ascmem.trace.CONTIGUOUS_UNITS, with each slab_max of SLAB_MAXES; the
    peak of device pages in use (huge and normal together, at the same
    moment) of the setting with the smallest, the default on a tie: the
    ``Device(placement=..., min_block=..., slab_max=...)`` to deploy with;
  - torch-caching: torch_npu's caching allocator, emulated
    (ascmem.emulations.torch_caching); its peak of reserved segments;
  - torch-expandable, torch-expandable-eager: the same with expandable
    segments (ascmem.emulations.torch_expandable), pages unmapped only before
    out-of-memory, or as soon as they are free; their peak of mapped pages.
    On a product (and mode) without virtual memory management torch_npu
    turns them off, so torch-caching's peak counts there (Fit.runs_as,
    NEEDS_VIRTUAL_MEMORY);
  - cann-raw: every request a runtime call in whole pages (ascmem.emulations.raw_cann);
  - bestfit-wilderness (asked for by name): textbook best fit keeping the
    arena's untouched end for last (ascmem.emulations.reference), one contiguous arena
    reserved in whole pages up to its high-water mark.
Then, for every product and mode, the card must hold, per instance (a
process sharing the card), that peak plus the weights and the media memory
(in whole 2 MiB pages) plus the headroom asked for, and once per card what
the runtime takes on the first job (AI CPU operator cache, system package:
profiles [P] [S] [G]).  A media window too small for the media memory of one
instance is the other limit that can be hit.

The workload's peak is measured on one reference device (the Atlas A2
training profile, EP), the same for every product: the page rules are the
same on all of them, and the media window and reserve are checked here, not
by the replay.
"""

import dataclasses

from ascmem import profiles
from ascmem.errors import InvalidArgumentError

PAGE = 2 << 20
ALLOCATORS = ("ascmem", "torch-caching", "torch-expandable", "torch-expandable-eager",
              "cann-raw")  # the default
PEERS = ALLOCATORS + ("bestfit-wilderness",)
# Expandable segments map physical memory into reserved address space, which
# the products without virtual memory management refuse (profiles [V]);
# torch_npu then warns and turns them off, so its caching allocator is what
# runs there: at start-up it tries aclrtReserveMemAddress and, when that
# fails, parses "expandable_segments:False" (Ascend/pytorch
# torch_npu/csrc/core/npu/NPUAllocatorConfig.cpp lines 306-323, at
# 9e73e708a; NPUException.h line 147: ACL_ERROR_RT_FEATURE_NOT_SUPPORT only
# warns there).
NEEDS_VIRTUAL_MEMORY = ("torch-expandable", "torch-expandable-eager")
REFERENCE = "atlas-a2-training"
REFERENCE_MEMORY = 120 << 30  # room for any workload a card could take: the fit is decided below


@dataclasses.dataclass
class Footprint:
    """What the workload itself needs under one allocator."""
    allocator: str
    peak: int                 # device bytes at the worst moment (a lower bound if not complete)
    media_peak: int           # of which media (DVPP) memory
    curve: list = dataclasses.field(default_factory=list, repr=False)  # bytes after each event
    complete: bool = True     # False: more than the reference device holds, so no card
    placement: str = None     # ascmem: the Device placement of this peak, the smallest's
    placements: dict = dataclasses.field(default_factory=dict)  # ascmem: placement -> peak,
    #                                                             in the default unit
    min_block: int = None     # ascmem: the Device unit of this peak
    slab_max: int = None      # ascmem: the Device slab_max of this peak
    plans: list = dataclasses.field(default_factory=list)  # ascmem: each setting tried:
    #                                                        placement, min_block, slab_max, peak


def _bounded(fp, peak_live):
    """fp, its peak raised to what is known when the replay did not finish:
    the workload needs at least its peak live bytes, and more than the
    reference device held (the failed replay's own peak means nothing)."""
    if not fp.complete:
        fp.peak = max(fp.peak, peak_live, REFERENCE_MEMORY)
    return fp


@dataclasses.dataclass
class Fit:
    """One product, mode and allocator."""
    model: str
    mode: str
    allocator: str
    memory: int               # the card's device memory (what applications get)
    first_job: int            # taken by the runtime on the first job, once per card
    need: int                 # instances x (workload + weights + media + headroom) + first_job
    fits: bool
    headroom: int             # memory - need (negative: short by that much)
    limit: str                # the limit that binds: "device memory" or "media window"
    runs_as: str = None       # the allocator whose peak counts here: the allocator, or
    #                           torch-caching for expandable segments without virtual memory


@dataclasses.dataclass
class Plan:
    trace: str
    peak_live: int
    weights: int
    instances: int
    headroom: int
    dvpp: int
    footprints: list
    fits: list
    smallest: dict            # allocator -> "model mode" of the smallest card that fits, or None


def _pages(n):
    return (n + PAGE - 1) // PAGE * PAGE


def footprints(trace, allocators=ALLOCATORS, curves=False):
    """The workload's peak under each allocator (Footprint list)."""
    import ascmem
    from ascmem.emulations import raw_cann
    from ascmem import trace as tr
    media = _media_only(tr._a_trace(trace))  # its peak, in whole pages: the media window's share
    media_peak = _pages(media.peak_live()) if len(media) else 0
    out = []
    for name in allocators:
        if name == "ascmem":
            out.append(_ascmem_footprint(trace, media_peak, curves))
        elif name.startswith("torch-"):
            alloc = tr.make_allocator(name, REFERENCE_MEMORY)  # torch-caching reads the conf
            rep = tr.replay(trace, alloc, curve=curves)
            out.append(Footprint(name, alloc.peak_reserved, media_peak,
                                 rep.get("curve_used", []), complete=not rep["failures"]))
        elif name == "cann-raw":
            dev = ascmem.Device(REFERENCE, memory=REFERENCE_MEMORY)
            raw = raw_cann.peak(trace, dev, curve=curves)
            out.append(Footprint(name, raw["peak"], media_peak, raw.get("curve", []),
                                 complete=raw["peak"] <= REFERENCE_MEMORY))
        elif name == "bestfit-wilderness":
            alloc = tr.make_allocator(name, REFERENCE_MEMORY)  # compiled, as reference.py's
            rep = tr.replay(trace, alloc, curve=curves)  # its curve: bytes held, not the arena
            out.append(Footprint(name, _pages(alloc.high_water), media_peak,
                                 rep.get("curve_used", []), complete=not rep["failures"]))
        else:
            raise InvalidArgumentError(f"unknown allocator {name!r}; known: {', '.join(PEERS)}")
    return out


def _ascmem_footprint(trace, media_peak, curves):
    """The Footprint of a Device under the placement, unit and slab_max, of
    the placements the reference Device takes (it is not paged: a contiguous
    Pool's) in each unit of CONTIGUOUS_UNITS with each slab_max of
    SLAB_MAXES, whose replay holds the fewest pages at its peak; a replay
    that failed never wins over one that did not, and the default
    (placement, unit and slab_max), listed first, wins a tie.  When every
    replay failed none says which holds less (a failed replay's peak is
    where it stopped: _bounded), so the default is kept."""
    import ascmem
    from ascmem import trace as tr
    tried = []
    for slab_max in tr.SLAB_MAXES:
        for unit in tr.CONTIGUOUS_UNITS:
            for placement in tr.CONTIGUOUS_PLACEMENTS:
                with ascmem.Device(REFERENCE, memory=REFERENCE_MEMORY, placement=placement,
                                   min_block=unit, slab_max=slab_max) as dev:
                    peak, failures, curve = tr.device_footprint(trace, dev, curve=curves)
                tried.append(Footprint("ascmem", peak, media_peak, curve, complete=not failures,
                                       placement=placement, min_block=unit, slab_max=slab_max))
    complete = [fp for fp in tried if fp.complete]
    best = min(complete, key=lambda fp: fp.peak) if complete else tried[0]
    best.placements = {fp.placement: fp.peak for fp in tried
                       if fp.min_block == tr.CONTIGUOUS_UNITS[0] and fp.slab_max == tr.SLAB_MAX}
    best.plans = [{"placement": fp.placement, "min_block": fp.min_block,
                   "slab_max": fp.slab_max, "peak": fp.peak} for fp in tried]
    return best


def _media_only(trace):
    from ascmem.trace.data import Columns, Trace
    c = trace.columns
    keep = c.kind == 3
    return Trace(columns=Columns(c.alloc[keep], c.ids[keep], c.size[keep], c.kind[keep],
                                 c.policy[keep]))


def first_job(profile, mode):
    """What the runtime takes on a card's first job: the AI CPU operator
    cache (its upper bound; training series, EP) and the system package."""
    cache = profile.aicpu_cache[1] if mode == "EP" else 0
    return cache + profile.first_job_package


def plan(trace, weights=0, instances=1, headroom=0, dvpp=0, models=None,
         allocators=ALLOCATORS, curves=False):
    """Whether trace fits on each product (models: names, default all) in
    each of its modes, per allocator; see the module's docstring."""
    for name, value in (("weights", weights), ("headroom", headroom), ("dvpp", dvpp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"{name} must be a number of bytes >= 0, not {value!r}")
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise InvalidArgumentError(f"instances must be an int >= 1, not {instances!r}")
    prints = footprints(trace, allocators, curves)  # checks that trace is one
    peak_live = trace.peak_live()
    prints = [_bounded(fp, peak_live) for fp in prints]
    caching = None  # torch-caching's footprint, once a product without virtual memory needs it
    fits = []
    for model in models or profiles.names():
        prof = profiles.get(model)
        for mode in prof.modes:
            lay = profiles.layout(prof, mode)
            memory = lay.reserve + lay.shared
            taken = first_job(prof, mode)
            for asked in prints:
                fp = asked
                if asked.allocator in NEEDS_VIRTUAL_MEMORY and not prof.virtual_memory_in(mode):
                    if caching is None:
                        caching = next((f for f in prints if f.allocator == "torch-caching"),
                                       None) or _bounded(footprints(trace, ["torch-caching"])[0],
                                                         peak_live)
                    fp = caching
                per_instance = fp.peak + _pages(weights) + _pages(dvpp) + headroom
                need = instances * per_instance + taken
                media = fp.media_peak + _pages(dvpp)
                limit = "device memory"
                ok = need <= memory and fp.complete
                if media > prof.media_window:
                    ok, limit = False, "media window"
                if not fp.complete:
                    limit = f"workload over {REFERENCE_MEMORY >> 30} GiB"
                fits.append(Fit(prof.name, mode, asked.allocator, memory, taken, need, ok,
                                memory - need, limit, fp.allocator))
    smallest = {}
    for fp in prints:
        good = [f for f in fits if f.allocator == fp.allocator and f.fits]
        best = min(good, key=lambda f: (f.memory, f.model, f.mode), default=None)
        smallest[fp.allocator] = f"{best.model} {best.mode}" if best else None
    return Plan(trace.name, peak_live, weights, instances, headroom, dvpp, prints, fits,
                smallest)

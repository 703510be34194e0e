# Tags: named groups of device blocks that can sleep -- give their physical
# memory back while keeping their addresses -- and wake again with their
# contents (what vLLM's sleep mode needs for weights and KV cache).  Needs a
# paged Device: a sleeping large block's granules are unmapped where no
# awake block shares them (ascm_pool_sleep); small blocks (slab slots) share
# their slab with other blocks, so they stay resident, contents in place.
# Included by _core.pyx.

from libc.string cimport memcpy


@cython.final
cdef class _TagRegistry:
    """Which live blocks carry which tag, and what each sleeping tag saved."""
    cdef dict tag_of        # address -> tag
    cdef dict members       # tag -> set of addresses
    cdef dict sleeping      # tag -> {address: saved bytes (None: not kept) or False: resident}
    cdef set known          # every tag a block was allocated with (resets keep it)
    cdef Py_ssize_t tracked # tagged live blocks: the free path's one test

    def __cinit__(self):
        self.tag_of = {}
        self.members = {}
        self.sleeping = {}
        self.known = set()

    cdef add(self, uint64_t addr, object tag):
        self.known.add(tag)
        self.tag_of[addr] = tag
        self.members.setdefault(tag, set()).add(addr)
        self.tracked += 1

    cdef forget(self, uint64_t addr):
        """A tagged block was freed (asleep or not)."""
        tag = self.tag_of.pop(addr, None)
        if tag is None:
            return
        self.members[tag].discard(addr)
        if not self.members[tag] and tag not in self.sleeping:
            del self.members[tag]
        saved = self.sleeping.get(tag)
        if saved is not None:
            saved.pop(addr, None)
        self.tracked -= 1

    cdef object asleep_tag(self, uint64_t addr):
        """The tag of addr if that tag sleeps, else None."""
        tag = self.tag_of.get(addr)
        return tag if tag is not None and tag in self.sleeping else None

    cdef uint64_t asleep_bytes(self, ascm_device *d):
        cdef uint64_t total = 0, n
        cdef ascm_pool *p
        for saved in self.sleeping.values():
            for addr, state in saved.items():
                p = ascm_device_pool_at(d, addr, NULL)
                if state is not False and p is not NULL and \
                        ascm_pool_usable_size(p, addr, &n) == ASCM_OK:
                    total += n
        return total

    cdef clear(self):
        self.tag_of.clear()
        self.members.clear()
        self.sleeping.clear()
        self.tracked = 0


cdef inline _check_tag(object tag):
    try:
        hash(tag)
    except TypeError:
        raise ArgumentTypeError(f"a tag must be hashable (a name), not {type(tag).__name__}") from None


cdef uint64_t _sleep_tag(Device dev, object tag, bint keep) except? 0:
    """Device.sleep: returns the bytes of device memory given back."""
    with dev._parts.map_lock():  # (the parts class is declared after this file)
        return _sleep_body(dev, tag, keep)


cdef uint64_t _sleep_body(Device dev, object tag, bint keep) except? 0:
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef _TagRegistry tags = parts.tags
    cdef ascm_pool *p
    cdef uint64_t n, given, released = 0
    _require_open(dev, "sleep")
    _check_tag(tag)
    if not parts.paged:
        raise UnsupportedError("sleep needs a paged device (Device(..., paged=True)): a "
                               "contiguous pool cannot give a block's memory back and keep its "
                               "address")
    if tag in tags.sleeping:
        raise InvalidArgumentError(f"sleep: tag {tag!r} is asleep already")
    # A tag no block was ever allocated with is a mistake (a typo would sleep
    # nothing and then refuse the right name's allocations until a wake,
    # issue 45.16).  A known tag with no block right now may sleep: it then
    # takes no new block until it wakes, as any sleeping tag.
    if tag not in tags.known:
        raise InvalidArgumentError(f"sleep: no block was ever allocated with tag {tag!r} on "
                                   f"this device")
    addrs = sorted(tags.members.get(tag, ()))
    for a in addrs:
        if parts.views.of(a):
            raise InvalidArgumentError(f"sleep: {a:#x} of tag {tag!r} has a live buffer view")
    copies = {}
    if keep and parts.mapper is not None:  # every copy first: a refused one changes nothing
        for a in addrs:
            p = ascm_device_pool_at(dev._d, a, NULL)
            ascm_pool_usable_size(p, a, &n)
            copies[a] = parts.mapper.to_host(a, n)
    saved = {}
    for a in addrs:
        p = ascm_device_pool_at(dev._d, a, NULL)
        ascm_pool_usable_size(p, a, &n)
        data = copies.get(a) if parts.mapper is not None else \
            ((<char *><size_t>a)[:n] if keep and parts.up.readable else None)
        if ascm_pool_sleep(p, a, &given) == ASCM_OK:
            saved[a] = data
            released += given
        else:  # a slab slot: its slab is shared, so it stays as it is
            saved[a] = False
    tags.sleeping[tag] = saved
    parts.apply_maps()
    return released


cdef uint64_t _wake_tag(Device dev, object tag) except? 0:
    """Device.wake: maps the tag's blocks again at their addresses and puts
    back what sleep kept; all or nothing.  Returns the bytes mapped."""
    with dev._parts.map_lock():
        return _wake_body(dev, tag)


cdef uint64_t _wake_body(Device dev, object tag) except? 0:
    cdef _DeviceParts parts = <_DeviceParts>dev._parts
    cdef _TagRegistry tags = parts.tags
    cdef ascm_pool *p
    cdef int st
    cdef uint64_t taken, mapped = 0
    _require_open(dev, "wake")
    _check_tag(tag)
    if tag not in tags.sleeping:
        raise InvalidArgumentError(f"wake: tag {tag!r} is not asleep")
    saved = tags.sleeping[tag]
    woken = []
    for a, data in saved.items():
        if data is False:
            continue
        p = ascm_device_pool_at(dev._d, a, NULL)
        st = ascm_pool_wake(p, a, &taken)
        if st == ASCM_OK and not parts.apply_maps():
            ascm_pool_sleep(p, a, NULL)  # the runtime refused: this one goes back to sleep too
            parts.apply_maps()
            st = ASCM_ERR_NOMEM
        if st != ASCM_OK:
            for b in woken:  # back to sleep: the device is left as it was
                ascm_pool_sleep(ascm_device_pool_at(dev._d, b, NULL), b, NULL)
            parts.apply_maps()
            b = dev.budget()
            raise OutOfMemoryError(f"wake({tag!r}): the device has no room to map {a:#x} again "
                                   f"({'the page budget is exhausted' if st == ASCM_ERR_BUDGET else 'the upstream refused'}); "
                                   f"{_fmt_bytes(b['huge_used'])} huge + {_fmt_bytes(b['normal_used'])} "
                                   f"normal of {_fmt_bytes(b['total'])} in use")
        woken.append(a)
        mapped += taken
    if parts.mapper is not None:  # acl: back to the device through aclrtMemcpy
        try:
            for a, data in saved.items():
                if data:
                    parts.mapper.to_device(a, data)
        except BaseException:
            for b in woken:  # asleep again, contents still kept: a later wake can retry
                ascm_pool_sleep(ascm_device_pool_at(dev._d, b, NULL), b, NULL)
            parts.apply_maps()
            raise
    else:
        for a, data in saved.items():
            if data:  # bytes kept by sleep(keep=True)
                memcpy(<void *><size_t>a, <const char *>data, len(data))
            elif data is None and parts.guards is not None:  # keep=False: fresh pages
                parts.guards.restore(a)
    del tags.sleeping[tag]
    if not tags.members.get(tag, True):
        del tags.members[tag]
    return mapped

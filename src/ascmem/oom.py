"""What an out-of-memory error of a Device says: which limit refused, its
size, and what was asked.

The limits are the device budget's three (csrc/device_budget.c, fits()):
the RC-mode huge-page reserve that cannot grow, the device's physical
memory, and the cap of set_memory_fraction / set_limit; and the kind's
address range, which is too small, full, or free in pieces none of which
fits.  The C device returns one status for the last kind it tried; the
budget's rule is applied again here to the request's pages to tell which
limit that was.
"""


def _fmt(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def asked(size, policy_name, kinds, last):
    """The request: its size and policy, the kinds that policy tries, and
    the kind whose refusal is reported (`last`, a name)."""
    tried = ", then ".join(k.name for k in kinds) if kinds else last
    but = f" ({last} refused last)" if len(kinds) > 1 else ""
    return (f"asked {_fmt(size)} ({size:,} bytes) with policy {policy_name}, which tries "
            f"{tried}{but}")


CAP = "cap"          # set_memory_fraction / set_limit
MEMORY = "memory"    # the device's physical memory
RESERVE = "reserve"  # the huge-page reserve, fixed in RC mode


def limits_broken(budget, huge, need):
    """The device budget's limits (CAP, MEMORY, RESERVE) that a charge of
    `need` more bytes of huge (or normal) pages breaks; budget:
    Device.budget()."""
    b = budget
    h = b["huge_used"] + (need if huge else 0)
    n = b["normal_used"] + (0 if huge else need)
    out = []
    if huge and not b["huge_grows"] and h > b["reserve"]:
        out.append(RESERVE)
    if max(0, h - b["reserve"]) + n + b["fixed"] > b["shared"]:
        out.append(MEMORY)
    if b["limit"] and h + n + b["fixed"] > b["limit"]:
        out.append(CAP)
    return out


def budget_refusal(budget, huge, need):
    """Sentences naming each limit a charge of `need` bytes breaks
    (limits_broken) and its size."""
    b = budget
    in_use = b["huge_used"] + b["normal_used"] + b["fixed"]
    now = (f"{_fmt(in_use)} in use ({_fmt(b['huge_used'])} huge + {_fmt(b['normal_used'])} "
           f"normal + {_fmt(b['fixed'])} runtime) + {_fmt(need)} of pages needed")
    out = []
    for limit in limits_broken(budget, huge, need):
        if limit == RESERVE:
            out.append(f"the huge-page reserve of {_fmt(b['reserve'])} is used up and cannot "
                       f"grow in RC mode ({_fmt(b['huge_used'])} huge in use + {_fmt(need)} "
                       f"needed)")
        elif limit == MEMORY:
            out.append(f"the device's memory of {_fmt(b['total'])} is exhausted: {now}")
        else:
            share = b["limit"] / b["total"] if b["total"] else 0.0
            out.append(f"the memory cap set by set_memory_fraction / set_limit refused: "
                       f"{_fmt(b['limit'])} ({b['limit']:,} bytes, a fraction of {share:.4g} "
                       f"of {_fmt(b['total'])}); {now}")
    if not out:  # another thread gave pages back between the failure and this reading
        out.append(f"the page budget refused ({now} now)")
    return "; and ".join(out)


def range_refusal(name, need, capacity, free, largest):
    """Why a kind's address range has no place for `need` bytes."""
    if need > capacity:
        return f"the request is larger than the whole {name} range of {_fmt(capacity)}"
    if free >= need:
        return (f"the {name} range is fragmented: {_fmt(free)} free, but the largest free "
                f"block is {_fmt(largest)}")
    return f"the {name} range is full: {_fmt(free)} free of {_fmt(capacity)}"

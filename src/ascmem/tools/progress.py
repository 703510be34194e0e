"""Progress on stderr for the commands' long steps -- loading a trace, each
replay, each bisection -- drawn by tqdm (the optional extra ``traces``) when
stderr is a terminal, and not at all otherwise or with ``--quiet``.  A bar
only watches: what is computed is the same with it or without it."""

import contextlib
import sys

_on = False


def configure(quiet=False):
    """Turns bars on when stderr is a terminal, tqdm is installed and quiet
    is false; off otherwise."""
    global _on
    _on = False
    if quiet or not sys.stderr.isatty():
        return
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return
    _on = True


@contextlib.contextmanager
def step(desc, total=None, unit="events"):
    """A bar for one step: yields update(done, total) to call now and then
    (the replays' progress callback), or None when bars are off."""
    if not _on:
        yield None
        return
    from tqdm import tqdm
    bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit != "replays", leave=False,
               file=sys.stderr, mininterval=0.25, dynamic_ncols=True)

    def update(done, total=None):
        if total is not None and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)
    try:
        yield update
    finally:
        bar.close()

"""Three placement rules of the contiguous Pool (issue 42, item 1).

The kept last freed block goes to best fit instead of back in place when the
free block just below it is 1/128 to 1 times its size: reused in place it
stranded that hole (unet_multires read 0.854 against best fit's 0.863,
vit_train 0.969 against 0.987).  Spare slabs go back before another class's
slab is placed: they split the free space it would take (bert_train and
seq2seq_generate fell just below best fit).  A large request of a size never
given back to best fit spares the free block at the arena's end when that
block is six times the request or more (the recorded video pipeline read
0.817 against 0.854 for best fit keeping the end for last)."""
import os

import pytest

import ascmem
from ascmem import trace as tr

KiB, MiB = 1 << 10, 1 << 20
BASE = 1 << 32


def kept_with_hole_below(hole, block):
    """A pool whose kept block (block bytes, at hole) has a free hole of hole
    bytes below it and a live block above it; the block's address."""
    pool = ascmem.Pool(256 * MiB, base=BASE)
    low = pool.alloc(hole)
    addr = pool.alloc(block)
    pool.alloc(64 * KiB)  # above: the kept block does not touch the arena's free end
    pool.free(low)
    pool.free(addr)  # kept; the hole below it is free (the earlier kept block went to best fit)
    return pool, addr


def test_the_kept_block_moves_down_into_a_smaller_hole_below_it():
    pool, addr = kept_with_hole_below(1 * MiB, 2 * MiB)
    assert addr == BASE + 1 * MiB
    assert pool.alloc(2 * MiB) == BASE  # in place it would leave the 1 MiB hole under it
    pool.check()


def test_the_kept_block_stays_in_place_beside_a_hole_of_its_size():
    # a hole that takes a block of its size: moving into it scatters a repeating layout
    pool, addr = kept_with_hole_below(2 * MiB, 2 * MiB)
    assert pool.alloc(2 * MiB) == addr
    pool.check()


def test_the_kept_block_stays_in_place_above_a_small_blocks_hole():
    # under 1/128 of the block: room for a small block, not worth moving for
    pool, addr = kept_with_hole_below(64 * KiB, 16 * MiB)
    assert pool.alloc(16 * MiB) == addr
    pool.check()


def test_a_free_then_alloc_loop_still_reuses_the_kept_block_in_place():
    pool = ascmem.Pool(64 * MiB, base=BASE)
    pool.alloc(1 * MiB)
    first = pool.alloc(4 * MiB)
    for _ in range(5):
        pool.free(first)
        assert pool.alloc(4 * MiB) == first
    pool.check()


def test_a_spare_slab_goes_back_before_another_class_takes_a_new_slab():
    pool = ascmem.Pool(64 * MiB, base=BASE)
    small = pool.alloc(100)
    pool.free(small)  # its slab empties: kept as its class's spare
    assert pool.stats()["cached_bytes"] > 0
    other = pool.alloc(5000)  # another class: a new slab
    assert pool.stats()["cached_bytes"] == 0
    pool.free(other)
    pool.check()


def test_one_class_loop_keeps_its_spare():
    pool = ascmem.Pool(64 * MiB, base=BASE)
    addr = pool.alloc(100)
    for _ in range(3):
        pool.free(addr)
        assert pool.alloc(100) == addr  # the spare serves it again: no new slab
    pool.check()


def test_the_traces_that_stranded_holes_reach_best_fit():
    for name, best_fit in (("unet_multires", 0.863), ("bert_train", 0.912)):
        eff, _ = tr.efficiency(tr.example(name), "pool")
        assert eff >= best_fit - 0.005, name


def end_smaller_than_a_hole(capacity):
    """A pool of capacity bytes with a free 8 MiB hole at its start and the
    free block at its end smaller than the hole (best fit's choice for a
    small request); the end's address."""
    pool = ascmem.Pool(capacity, base=BASE)
    hole = pool.alloc(8 * MiB)
    pool.alloc(64 * KiB)
    pool.free(hole)
    return pool, BASE + 8 * MiB + 64 * KiB


def test_a_new_size_spares_the_end_six_times_its_size():
    pool, end = end_smaller_than_a_hole(16 * MiB)  # end: 7.9 MiB, hole: 8 MiB
    assert pool.alloc(1 * MiB) == BASE  # best fit would split the end
    pool.check()


def test_a_size_given_back_before_takes_best_fit_end_included():
    pool = ascmem.Pool(17 * MiB, base=BASE)
    pool.free(pool.alloc(1 * MiB))
    first = pool.alloc(2 * MiB)  # another size: the 1 MiB block goes back to best fit
    assert first == BASE
    hole = pool.alloc(8 * MiB)
    pool.alloc(64 * KiB)
    pool.free(hole)  # end: 6.9 MiB, hole: 8 MiB
    assert pool.alloc(1 * MiB) == BASE + 10 * MiB + 64 * KiB  # the end, as best fit
    pool.check()


def test_an_end_under_six_times_the_request_is_a_snug_fit_and_taken():
    pool, end = end_smaller_than_a_hole(12 * MiB)  # end: 3.9 MiB
    assert pool.alloc(1 * MiB) == end
    pool.check()


def test_a_reset_forgets_the_sizes_given_back():
    pool = ascmem.Pool(16 * MiB, base=BASE)
    pool.free(pool.alloc(1 * MiB))
    pool.alloc(2 * MiB)
    pool.reset()
    hole = pool.alloc(8 * MiB)
    pool.alloc(64 * KiB)
    pool.free(hole)
    assert pool.alloc(1 * MiB) == BASE  # a new size again
    pool.check()


PIPELINE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "traces",
                        "pipeline.csv.gz")


@pytest.mark.skipif(not os.path.exists(PIPELINE), reason="the recorded pipeline trace is kept "
                    "outside the repository")
def test_the_recorded_pipeline_reaches_best_fit_keeping_the_end():
    eff, _ = tr.efficiency(tr.load(PIPELINE), "pool")
    assert eff >= 0.854 - 0.005  # 0.817 before; best fit, end kept for last: 0.854

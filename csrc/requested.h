/* The bytes torch asked for through the pluggable functions (torch's
 * requested_bytes statistic), per device index and stat type, counted by
 * each thread on a line of its own (requested.c).  Header-only interface for
 * pluggable.c, which includes the public header and this alone. */
#ifndef ASCMEM_REQUESTED_H
#define ASCMEM_REQUESTED_H

#include <stdint.h>

#define ASCM_REQ_DEVICES 64 /* device indices the pluggable functions serve */
#define ASCM_REQ_TYPES 3    /* torch's stat types: all, small pool, large pool */

/* Adds delta (positive: an allocation) to type 0 and to type t (1 or 2) of
 * device index device, keeping their peaks. */
void ascm_requested_add(int device, int t, int64_t delta);
/* The current bytes and peaks of every type of a device index. */
void ascm_requested_read(int device, int64_t now[ASCM_REQ_TYPES], int64_t peak[ASCM_REQ_TYPES]);
/* Zeroes a device index's counts and peaks (a device registered there). */
void ascm_requested_clear(int device);
/* Peaks of a device index back to its current bytes. */
void ascm_requested_reset_peaks(int device);

#endif /* ASCMEM_REQUESTED_H */

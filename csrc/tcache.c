/* Thread caches: slab slots a thread freed, kept for its next allocations of
 * the same class without the pool lock.
 *
 * One cache per (thread, pool), made on the thread's first call after the
 * caches are on: from ascm_pool_set_thread_caches(ON), or with AUTO from the
 * first time two threads meet at the pool lock (Python's default).  A thread
 * that frees blocks another thread allocated moves the slab's lines between
 * cores on each call, which the lock batches better, so while caches are on
 * a thread that mostly allocates or mostly frees passes its cache by
 * (passes()).
 *
 * Slot states: free (taken bit 0), live (taken 1, live flag 1: a caller
 * holds it), cached (taken 1, live 0: in some thread's cache).  The live
 * flag sits in the slot's word beside its slack (pool_core.h).  A free by
 * address goes live -> cached without the pool lock: the slab table (leaves
 * never freed) finds the descriptor (not freed while caches are on), and an
 * atomic fetch-and on the slot's word decides between a racing double free
 * and the first one.  Handing a cached slot out is a plain store: the slot
 * is the cache's alone.  The pool's own paths change slot words atomically
 * too.
 *
 * Locks, outermost first: the pool's caches_lock (the list), a cache's lock
 * (others take it to flush the cache; its owner enters by a flag instead,
 * and takes the lock only while a stopper holds the cache: owner_enter),
 * the pool lock.
 * Everything that reads the pool whole -- stats, check, walks, trim, reset,
 * close -- first takes every cache's lock and flushes them (ascm_tcache_stop),
 * so statistics and check() are exact.  Counters a cache changes without the
 * pool lock are merged at each refill, flush and stop; peaks are updated
 * there, so between merges a peak may miss at most what one cache holds
 * (TC_CLASS_BYTES per class).  An allocation that fails flushes every cache
 * and tries once more.
 *
 * Lifetime: a cache is freed by whichever of its thread (at exit) and its
 * pool (at destroy) lets go last; the other marks it gone.  Entries in the
 * thread's table carry the pool's uid, so a new pool at a destroyed one's
 * address never meets the old cache.
 */
#include "internal.h"
#include "pool_core.h"

#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>

#define TC_SLOTS 32           /* slots a class may hold */
/* 256 KiB: a smaller class sends the large classes' cached calls to the lock
 * for refills and flushes too often to pay */
#define TC_CLASS_BYTES 262144 /* ... and bytes: a class holds at most this, */
#define TC_MIN_SLOTS 4        /* or this many slots */
#define TC_POOLS 8           /* pools one thread keeps caches for */
#define TC_WINDOW 4096       /* calls between looks at the thread's balance (see passes) */
#define TC_SKEW 4            /* allocations / frees past which a thread passes its cache by */
#define TC_MISS 1

typedef struct ascm_tcache {
    ascm_lock lock;
    /* the owner's way in without the lock (owner_enter): busy is the owner's,
     * stopped a stopper's (ascm_tcache_stop) */
    _Atomic int busy, stopped;
    ascm_pool *pool;
    struct ascm_tcache *next; /* the pool's list, under caches_lock */
    pthread_t owner;
    int pool_gone, thread_gone; /* under lock (pool_gone also read __atomic by its thread) */
    /* the owner's alone: calls left in this window and its allocations, and
     * whether it passes the cache by (passes) */
    uint32_t window_left, window_allocs;
    int bypass;
    /* counter changes since the last merge into the pool */
    int64_t used, requested, live;
    uint64_t allocs, frees, alloc_bytes, freed_bytes, alloc_requested, freed_requested;
    uint8_t n[ASCM_SLAB_CLASSES];
    uint8_t cap[ASCM_SLAB_CLASSES];
    /* the classes' geometry, copied: the pool's lines are written under its lock */
    uint32_t size[ASCM_SLAB_CLASSES];
    uint64_t div_magic[ASCM_SLAB_CLASSES];
    uint64_t off[ASCM_SLAB_CLASSES][TC_SLOTS]; /* byte offsets of cached slots, newest last */
} ascm_tcache;

typedef struct thread_caches {
    ascm_pool *pool[TC_POOLS];
    uint64_t uid[TC_POOLS];
    ascm_tcache *cache[TC_POOLS];
} thread_caches;

static __thread thread_caches *mine;
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static uint64_t next_uid = 1; /* __atomic */

/* Pool lock held: the cache's counters into the pool's. */
static void merge(ascm_pool *p, ascm_tcache *c) {
    p->used += (uint64_t)c->used;
    p->requested += (uint64_t)c->requested;
    p->live_count += (uint64_t)c->live;
    p->alloc_count += c->allocs;
    p->free_count += c->frees;
    p->alloc_bytes += c->alloc_bytes;
    p->freed_bytes += c->freed_bytes;
    p->alloc_requested += c->alloc_requested;
    p->freed_requested += c->freed_requested;
    if (p->used > p->peak_used) p->peak_used = p->used;
    if (p->requested > p->peak_requested) p->peak_requested = p->requested;
    if (p->live_count > p->peak_live_count) p->peak_live_count = p->live_count;
    c->used = c->requested = c->live = 0;
    c->allocs = c->frees = c->alloc_bytes = c->freed_bytes = c->alloc_requested = c->freed_requested = 0;
}

/* Pool lock held: the oldest n slots of class cls go back to their slabs. */
static void give_back(ascm_pool *p, ascm_tcache *c, int cls, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        uint64_t off = c->off[cls][i];
        ascm_slab *s = ascm_slab_of(p, off);
        ascm_slab_put(p, s->index, (uint64_t)ascm_slab_slot_of(p, s, off));
    }
    c->n[cls] -= (uint8_t)n;
    memmove(c->off[cls], c->off[cls] + n, c->n[cls] * sizeof c->off[cls][0]);
}

/* Pool lock held: empties the cache. */
static void flush_locked(ascm_pool *p, ascm_tcache *c) {
    for (int cls = 0; cls < ASCM_SLAB_CLASSES; cls++)
        if (c->n[cls]) give_back(p, c, cls, c->n[cls]);
    merge(p, c);
}

/* ---- the thread's table ---------------------------------------------- */

static void release_entry(ascm_tcache *c) { /* its thread lets go */
    ascm_lock_acquire(&c->lock);
    if (c->pool_gone) {
        ascm_lock_release(&c->lock);
        free(c);
        return;
    }
    ascm_pool *p = c->pool;
    ascm_pool_lock(p);
    flush_locked(p, c);
    ascm_pool_unlock(p);
    c->thread_gone = 1;
    ascm_lock_release(&c->lock);
}

static void thread_exits(void *arg) {
    thread_caches *t = arg;
    mine = NULL; /* a later call in this thread's exit (another key's destructor) starts afresh */
    for (int i = 0; i < TC_POOLS; i++)
        if (t->cache[i]) release_entry(t->cache[i]);
    free(t);
}

static void make_key(void) { pthread_key_create(&exit_key, thread_exits); }

static ascm_tcache *new_cache(ascm_pool *p) {
    ascm_heavy_barrier_ready(); /* before the first cache anywhere: owners enter by flag if so */
    ascm_tcache *c = ascm_zalloc_lines(sizeof *c);
    if (!c) return NULL;
    c->pool = p;
    c->owner = pthread_self();
    c->window_left = TC_WINDOW;
    for (int cls = 0; cls < ASCM_SLAB_CLASSES; cls++) {
        const ascm_slab_class *k = &p->classes[cls];
        uint32_t n = TC_CLASS_BYTES / k->size;
        c->cap[cls] = (uint8_t)(n < TC_MIN_SLOTS ? TC_MIN_SLOTS : n > TC_SLOTS ? TC_SLOTS : n);
        c->size[cls] = k->size;
        c->div_magic[cls] = k->div_magic;
    }
    ascm_lock_acquire(&p->caches_lock);
    for (ascm_tcache **link = &p->caches; *link;) { /* caches of threads that have ended */
        ascm_tcache *old = *link;
        ascm_lock_acquire(&old->lock); /* thread_gone was set under it */
        int gone = old->thread_gone;
        ascm_lock_release(&old->lock);
        if (gone) {
            *link = old->next;
            free(old);
        } else {
            link = &old->next;
        }
    }
    c->next = p->caches;
    __atomic_store_n(&p->caches, c, __ATOMIC_RELEASE);
    ascm_lock_release(&p->caches_lock);
    return c;
}

/* cache_of past its first entry: another entry (moved to the front, so that
 * a thread's calls on one pool look at one entry), or a new cache. */
static __attribute__((noinline)) ascm_tcache *cache_of_slow(ascm_pool *p) {
    thread_caches *t = mine;
    if (ASCM_LIKELY(t != NULL))
        for (int i = 1; i < TC_POOLS; i++)
            if (t->pool[i] == p && t->uid[i] == p->uid) {
                ascm_pool *p0 = t->pool[0];
                uint64_t u0 = t->uid[0];
                ascm_tcache *c0 = t->cache[0], *c = t->cache[i];
                t->pool[0] = p, t->uid[0] = p->uid, t->cache[0] = c;
                t->pool[i] = p0, t->uid[i] = u0, t->cache[i] = c0;
                return c;
            }
    if (!t) {
        pthread_once(&key_once, make_key);
        if (!(t = calloc(1, sizeof *t))) return NULL;
        if (pthread_setspecific(exit_key, t) != 0) {
            free(t);
            return NULL;
        }
        mine = t;
    }
    int slot = -1;
    for (int i = 0; i < TC_POOLS && slot < 0; i++) {
        ascm_tcache *c = t->cache[i];
        if (!c) {
            slot = i;
            continue;
        }
        if (__atomic_load_n(&c->pool_gone, __ATOMIC_ACQUIRE)) { /* its pool was destroyed */
            ascm_lock_acquire(&c->lock); /* destroy may still be letting go of it */
            ascm_lock_release(&c->lock);
            free(c);
            t->cache[i] = NULL;
            slot = i;
        }
    }
    if (slot < 0) return NULL;
    ascm_tcache *c = new_cache(p);
    if (!c) return NULL;
    t->pool[slot] = p;
    t->uid[slot] = p->uid;
    t->cache[slot] = c;
    return c;
}

/* This thread's cache for p, made if need be; NULL when none can be had.
 * The first entry in line: the common case is one pool per thread, and a
 * call with a loop would be a large part of a cached call. */
static inline ascm_tcache *cache_of(ascm_pool *p) {
    thread_caches *t = mine;
    if (ASCM_LIKELY(t != NULL) && ASCM_LIKELY(t->pool[0] == p) && ASCM_LIKELY(t->uid[0] == p->uid))
        return t->cache[0];
    return cache_of_slow(p);
}

/* ---- the owner's way in ------------------------------------------------- */

/* An owner took its cache's lock on every call: an atomic exchange, a fifth
 * of a cached pair, for a lock no one else wanted but a stopper (statistics,
 * check(), trims, resets: ascm_tcache_stop).  Now the owner raises its busy
 * flag and looks at the cache's stop flag; a stopper raises every stop flag,
 * has a barrier run on every thread (barrier.c), then waits for each busy
 * flag to fall and takes the locks.  The barrier orders each owner's flag
 * before its look, the fence an owner no longer pays: either the owner sees
 * the stop flag, and takes the lock as before, or the stopper sees it busy,
 * and waits.  So a thread alone with its cache pays no fence and no lock
 * per call.  Without a barrier (not Linux, or
 * ASCMEM_NO_BARRIER=1), owners take the lock. */
static inline int owner_enter(ascm_tcache *c) { /* 1: by the flag; 0: holding the lock */
    if (ASCM_LIKELY(atomic_load_explicit(&ascm_barrier_on, memory_order_relaxed))) {
        atomic_store_explicit(&c->busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst); /* the flag before the look, for the compiler */
        if (ASCM_LIKELY(!atomic_load_explicit(&c->stopped, memory_order_acquire))) return 1;
        atomic_store_explicit(&c->busy, 0, memory_order_release);
    }
    ascm_lock_acquire(&c->lock);
    return 0;
}

static inline void owner_leave(ascm_tcache *c, int flag) {
    if (flag) atomic_store_explicit(&c->busy, 0, memory_order_release);
    else ascm_lock_release(&c->lock);
}

/* ---- the fast paths ---------------------------------------------------- */

/* A cache pays only when its thread frees what it allocates: a block freed
 * by another thread moves its slab's lines between cores on every call, and
 * a cache cannot batch that away as the lock does.  So each TC_WINDOW calls the
 * thread's balance is looked at: a thread that mostly allocates, or mostly
 * frees, passes its cache by (its slots go back) until it balances again. */
static __attribute__((noinline)) int look_at_balance(ascm_pool *p, ascm_tcache *c) {
    uint32_t a = c->window_allocs, f = TC_WINDOW - a;
    int bypass = a > TC_SKEW * f || f > TC_SKEW * a;
    c->window_allocs = 0;
    c->window_left = TC_WINDOW;
    if (bypass && !c->bypass) {
        ascm_lock_acquire(&c->lock);
        ascm_pool_lock(p);
        flush_locked(p, c);
        ascm_pool_unlock(p);
        ascm_lock_release(&c->lock);
    }
    c->bypass = bypass;
    return bypass;
}

/* Whether the owner passes its cache by; counts the call.  In line but for
 * the look at the window's end, since it runs on every cached call. */
static inline int passes(ascm_pool *p, ascm_tcache *c, int is_alloc) {
    c->window_allocs += (uint32_t)is_alloc;
    if (ASCM_LIKELY(--c->window_left != 0)) return c->bypass;
    return look_at_balance(p, c);
}


/* Pool lock not held, cache's held: up to half a cache of class cls. */
static void refill(ascm_pool *p, ascm_tcache *c, int cls) {
    unsigned want = c->cap[cls] / 2;
    ascm_pool_lock(p);
    merge(p, c);
    for (unsigned i = 0; i < want && !p->closed; i++) {
        uint32_t si, slot;
        if (ascm_slab_take(p, cls, &si, &slot) != ASCM_OK) break;
        const ascm_slab *s = p->slabs[si];
        c->off[cls][c->n[cls]++] = s->off + (uint64_t)slot * p->classes[cls].size;
    }
    ascm_pool_unlock(p);
}

int ascm_tcache_alloc(ascm_pool *p, uint64_t size, uint64_t requested, uint64_t align, uint64_t *addr) {
    int cls = ascm_pool_class_of(p, size, align);
    if (cls < 0) return TC_MISS;
    ascm_tcache *c = cache_of(p);
    if (!c || passes(p, c, 1)) return TC_MISS;
    int flag = owner_enter(c);
    if (ASCM_UNLIKELY(!ascm_caches_on(p))) goto miss; /* turned off while we waited */
    if (!c->n[cls]) refill(p, c, cls);
    if (!c->n[cls]) goto miss;
    uint64_t off = c->off[cls][--c->n[cls]];
    ascm_slab *s = ascm_slab_of(p, off); /* a taken slot: its slab stays */
    uint32_t slot_size = c->size[cls];
    uint64_t slot = ((off - s->off) * c->div_magic[cls]) >> 48;
    ascm_slab_hand_out(s, slot, slot_size - requested); /* a plain store: the slot is this cache's */
    c->used += slot_size;
    c->requested += (int64_t)requested;
    c->live++;
    c->allocs++;
    c->alloc_bytes += slot_size;
    c->alloc_requested += requested;
    owner_leave(c, flag);
    *addr = p->base + off;
    return ASCM_OK;
miss:
    owner_leave(c, flag);
    return TC_MISS;
}

int ascm_tcache_free(ascm_pool *p, uint64_t addr) {
    uint64_t off = addr - p->base; /* below base wraps past size */
    /* not in a slab: a large block, or no block (the table's leaves are
     * never freed, so this look needs no lock; the descriptor's does) */
    if (off >= p->size || !ascm_slab_of(p, off)) return TC_MISS;
    ascm_tcache *c = cache_of(p);
    if (!c || passes(p, c, 0)) return TC_MISS;
    int flag = owner_enter(c);
    if (ASCM_UNLIKELY(!ascm_caches_on(p))) goto miss;
    /* While this cache is entered, no descriptor is freed (caches are on,
     * and ascm_tcache_stop waits for its owner to leave); but s may be released
     * and taken by another slab of its class meanwhile -- only if off is not
     * live, since a live slot keeps its slab -- hence the second look. */
    ascm_slab *s = ascm_slab_of(p, off);
    if (!s) goto miss; /* a large block, or not a block */
    int cls = (int)s->cls;
    uint32_t size = c->size[cls];
    uint64_t soff = __atomic_load_n(&s->off, __ATOMIC_ACQUIRE), rel = off - soff;
    uint64_t slot = (rel * c->div_magic[cls]) >> 48;
    if (slot >= s->count || slot * size != rel) goto miss;
    uint32_t slack;
    if (!ascm_slab_unlive(s, slot, &slack)) goto miss; /* the pool says why */
    if (ascm_slab_of(p, off) != s || __atomic_load_n(&s->off, __ATOMIC_ACQUIRE) != soff) {
        /* a bad free that raced a release: the flag goes back */
        __atomic_fetch_or(&s->slack[slot], (uint16_t)ASCM_SLOT_LIVE, __ATOMIC_RELAXED);
        goto miss;
    }
    uint64_t requested = size - slack;
    if (c->n[cls] == c->cap[cls]) {
        ascm_pool_lock(p);
        give_back(p, c, cls, (c->n[cls] + 1) / 2);
        merge(p, c);
        ascm_pool_unlock(p);
    }
    c->off[cls][c->n[cls]++] = off;
    c->used -= size;
    c->requested -= (int64_t)requested;
    c->live--;
    c->frees++;
    c->freed_bytes += size;
    c->freed_requested += requested;
    owner_leave(c, flag);
    return ASCM_OK;
miss:
    owner_leave(c, flag);
    return TC_MISS;
}

/* ---- the pool's side ---------------------------------------------------- */

static void fork_child(ascm_fork_node *n);

void ascm_tcache_init(ascm_pool *p) {
    p->uid = __atomic_fetch_add(&next_uid, 1, __ATOMIC_RELAXED);
    if (!p->lock_at) p->caches_mode = ASCM_CACHES_OFF;
    else ascm_fork_register(&p->caches_fork, &p->caches_lock, ASCM_FORK_CACHES, fork_child);
}

void ascm_tcache_destroy(ascm_pool *p) {
    ascm_fork_unregister(&p->caches_fork);
    ascm_lock_acquire(&p->caches_lock);
    for (ascm_tcache *c = p->caches, *next; c; c = next) {
        next = c->next;
        ascm_lock_acquire(&c->lock);
        __atomic_store_n(&c->pool_gone, 1, __ATOMIC_RELEASE);
        int dead = c->thread_gone;
        ascm_lock_release(&c->lock);
        if (dead) free(c);
    }
    p->caches = NULL;
    ascm_lock_release(&p->caches_lock);
}

__attribute__((noinline)) void ascm_pool_lock_contended(ascm_pool *p) {
    ascm_lock_slow(p->lock_at);
    if (p->caches_mode == ASCM_CACHES_AUTO && !p->caches_on) {
        ascm_slab_sync_live(p);
        __atomic_store_n(&p->caches_on, 1, __ATOMIC_RELAXED);
    }
}

/* Caches come on only under the pool lock, hence the second look. */
int ascm_pool_lock_whole(ascm_pool *p) {
    if (!ascm_caches_on(p)) {
        ascm_pool_lock(p);
        if (ASCM_LIKELY(!ascm_caches_on(p))) return 0;
        ascm_pool_unlock(p);
    }
    ascm_tcache_stop(p);
    return 1;
}

void ascm_pool_unlock_whole(ascm_pool *p, int whole) {
    if (whole) ascm_tcache_go(p);
    else ascm_pool_unlock(p);
}

/* Every cache locked and flushed, and the pool lock held: the pool as if no
 * cache existed, until ascm_tcache_go. */
void ascm_tcache_stop(ascm_pool *p) {
    ascm_lock_acquire(&p->caches_lock);
    if (p->caches && atomic_load_explicit(&ascm_barrier_on, memory_order_relaxed)) { /* owner_enter says why */
        for (ascm_tcache *c = p->caches; c; c = c->next)
            atomic_store_explicit(&c->stopped, 1, memory_order_relaxed);
        ascm_heavy_barrier(); /* cannot fail once init has said yes (barrier.c) */
        for (ascm_tcache *c = p->caches; c; c = c->next)
            for (unsigned spins = 0; atomic_load_explicit(&c->busy, memory_order_acquire); spins++)
                if (spins % 64 == 63) sched_yield(); /* an owner mid-call: it leaves soon */
    }
    for (ascm_tcache *c = p->caches; c; c = c->next) ascm_lock_acquire(&c->lock);
    ascm_pool_lock(p);
    for (ascm_tcache *c = p->caches; c; c = c->next) flush_locked(p, c);
    ascm_slab_free_idle(p); /* no cache can be reading a descriptor now */
}

void ascm_tcache_go(ascm_pool *p) {
    ascm_pool_unlock(p);
    for (ascm_tcache *c = p->caches; c; c = c->next) {
        /* release: an owner that reads it enters after the flush above */
        atomic_store_explicit(&c->stopped, 0, memory_order_release);
        ascm_lock_release(&c->lock);
    }
    ascm_lock_release(&p->caches_lock);
}

int ascm_pool_set_thread_caches(ascm_pool *p, int mode) {
    if (mode != ASCM_CACHES_AUTO && mode != ASCM_CACHES_OFF && mode != ASCM_CACHES_ON) return ASCM_ERR_INVAL;
    if (!p->lock_at) return mode == ASCM_CACHES_OFF ? ASCM_OK : ASCM_ERR_INVAL;
    ascm_tcache_stop(p);
    p->caches_mode = mode;
    if (mode == ASCM_CACHES_ON && !p->caches_on) ascm_slab_sync_live(p);
    if (mode != ASCM_CACHES_AUTO) __atomic_store_n(&p->caches_on, mode == ASCM_CACHES_ON, __ATOMIC_RELAXED);
    ascm_tcache_go(p);
    return ASCM_OK;
}

int ascm_pool_thread_caches_on(const ascm_pool *p) { return ascm_caches_on(p); }

/* In a child after fork(): the caches of threads that were not copied are
 * dropped.  Their lock may have been held mid-change, so their contents are
 * not read; their slots (taken, not live) are found in the slabs instead and
 * go back, and the counters are recounted from the live blocks. */
static void fork_child(ascm_fork_node *n) {
    ascm_pool *p = (ascm_pool *)((char *)n - offsetof(ascm_pool, caches_fork));
    if (!p->caches) return;
    pthread_t self = pthread_self();
    for (ascm_tcache *c = p->caches; c; c = c->next) {
        if (pthread_equal(c->owner, self)) {
            flush_locked(p, c);
            continue;
        }
        c->lock.held = 0;
        atomic_store(&c->busy, 0); /* its owner may have been mid-call */
        atomic_store(&c->stopped, 0);
        c->thread_gone = 1;
        memset(c->n, 0, sizeof c->n);
        merge(p, c);
    }
    for (uint32_t si = 1; si < p->nslabs_used; si++) {
        ascm_slab *s = ascm_slab_in_use(p, si);
        if (!s) continue;
        for (uint64_t slot = 0; slot < s->count; slot++)
            if (((s->bits[slot >> 6] >> (slot & 63)) & 1u) && !ascm_slab_is_live(p, s, slot)) {
                ascm_slab_put(p, si, slot);
                if (!ascm_slab_in_use(p, si)) break; /* the slab emptied and went */
            }
    }
    ascm_pool_recount(p);
}

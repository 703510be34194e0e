/* Fork safety: a child process inherits every lock in the state it had in the
 * parent, but none of the parent's other threads -- a lock one of them held
 * mid-call (a batch, check(), a growth) would stay held in the child forever.
 * So every lock that threads share is registered here, and around fork() the
 * forking thread takes them all (prepare), then releases them in the parent
 * and in the child.  The child starts with every lock free and every
 * structure in a state some call left it in, never half-way.
 *
 * Locks are taken by rank, and within a rank in any order; ranks follow the
 * order the core itself nests locks in: a device's chunk-table lock (0), then
 * a pool's thread-cache list lock (1), then pool locks (2), then a device's
 * budget lock (3), which the device's charged pools take as their own lock
 * and so is registered once, by the device.  The registry's own mutex is
 * outermost: nothing registers or unregisters while holding a core lock.
 */
#include "internal.h"

#include <pthread.h>

static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;
static ascm_fork_node heads[ASCM_FORK_RANKS]; /* circular lists; heads[r] is the sentinel */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void prepare(void) {
    pthread_mutex_lock(&registry);
    for (int r = 0; r < ASCM_FORK_RANKS; r++)
        for (ascm_fork_node *n = heads[r].next; n != &heads[r]; n = n->next) ascm_lock_acquire(n->lock);
}

static void release_all(void) {
    for (int r = ASCM_FORK_RANKS - 1; r >= 0; r--)
        for (ascm_fork_node *n = heads[r].next; n != &heads[r]; n = n->next) ascm_lock_release(n->lock);
}

static void parent(void) {
    release_all();
    pthread_mutex_unlock(&registry);
}

static void child(void) {
    release_all();
    /* nor do the threads that waited for a lock (a holder hands over to them) */
    for (int r = 0; r < ASCM_FORK_RANKS; r++)
        for (ascm_fork_node *n = heads[r].next; n != &heads[r]; n = n->next)
            atomic_store_explicit(&n->lock->waiters, 0, memory_order_relaxed);
    /* threads counted inside a structure in the parent do not exist here */
    for (int r = 0; r < ASCM_FORK_RANKS; r++)
        for (ascm_fork_node *n = heads[r].next; n != &heads[r]; n = n->next)
            if (n->in_child) n->in_child(n);
    pthread_mutex_unlock(&registry);
}

static void install(void) {
    for (int r = 0; r < ASCM_FORK_RANKS; r++) heads[r].next = heads[r].prev = &heads[r];
    pthread_atfork(prepare, parent, child);
}

void ascm_fork_register(ascm_fork_node *n, ascm_lock *lock, int rank, void (*in_child)(ascm_fork_node *)) {
    pthread_once(&once, install);
    n->lock = lock;
    n->in_child = in_child;
    pthread_mutex_lock(&registry);
    n->next = heads[rank].next;
    n->prev = &heads[rank];
    heads[rank].next->prev = n;
    heads[rank].next = n;
    pthread_mutex_unlock(&registry);
}

void ascm_fork_unregister(ascm_fork_node *n) {
    if (!n->next) return; /* never registered */
    pthread_mutex_lock(&registry);
    n->prev->next = n->next;
    n->next->prev = n->prev;
    pthread_mutex_unlock(&registry);
    n->next = n->prev = NULL;
}

/* The four callbacks of CANN's external allocator (acl_rt_allocator.h in
 * hicann/runtime, include/external/acl/acl_rt_allocator.h): an application
 * hands them to the runtime with aclrtAllocatorSet*FuncToDesc and
 * aclrtAllocatorRegister, and the runtime then takes a stream's memory from
 * them.  Exported from this extension's .so with exactly those prototypes
 * (aclrtAllocator, aclrtAllocatorBlock and aclrtAllocatorAddr are void *):
 *
 *   void *ascmem_acl_alloc(aclrtAllocator, size_t)                         alloc
 *   void  ascmem_acl_free(aclrtAllocator, aclrtAllocatorBlock)             free
 *   void *ascmem_acl_alloc_advise(aclrtAllocator, size_t, aclrtAllocatorAddr)
 *   void *ascmem_acl_get_addr_from_block(aclrtAllocatorBlock)              address
 *
 * The allocator object is one of a fixed table of slots, each pointing at a
 * Device (bound from Python: ascmem.acl.register_allocator).  A block is the
 * device address itself, so get_addr_from_block is the identity and costs
 * the runtime nothing.  The callbacks run on the runtime's threads without
 * the GIL: the device's pools and budget are locked in C, and a slot counts
 * the calls inside it so that unbinding can wait for them (by phase, below).
 * Bad input (an allocator pointer that is not a slot, an unbound slot, a
 * block that is not a live block of the slot's device) is refused -- NULL,
 * or a free that does nothing -- never undefined behaviour.
 */
#include "ascmem.h"
#include "ascmem_acl_allocator.h" /* the exported prototypes, checked against the definitions */
#include "stripes.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

/* A slot counts the calls inside it in two phases, so that bind() waits only
 * for the calls that may have read the device it replaces: calls that enter
 * after bind() flipped the phase count in the other one, and read the new
 * device.  With one count, bind() waited for a moment with no call inside,
 * which callers that never pause may never give it (a test saw bind() wait
 * for minutes on two cores). */
typedef struct acl_slot {
    _Alignas(64) _Atomic(ascm_device *) device;
    _Atomic unsigned phase;
    /* callbacks between enter() and leave(), by phase, by stripe of threads
     * (stripes.h: the runtime calls from its own threads) */
    ascm_stripe users[2][ASCM_STRIPES];
} acl_slot;

static acl_slot slots[ASCM_ACL_ALLOCATOR_SLOTS];
static pthread_mutex_t binding = PTHREAD_MUTEX_INITIALIZER; /* one bind() at a time */

void *ascm_acl_allocator_handle(int slot) {
    if (slot < 0 || slot >= ASCM_ACL_ALLOCATOR_SLOTS) return NULL;
    return &slots[slot];
}

int ascm_acl_allocator_bind(int slot, ascm_device *d) {
    if (slot < 0 || slot >= ASCM_ACL_ALLOCATOR_SLOTS) return ASCM_ERR_INVAL;
    acl_slot *s = &slots[slot];
    pthread_mutex_lock(&binding);
    atomic_store(&s->device, d);
    /* Sequentially consistent, like enter(): a call that counts itself in
     * the old phase after the flip reads the device stored above. */
    unsigned old = atomic_fetch_xor(&s->phase, 1u);
    while (!ascm_stripes_empty(s->users[old])) sched_yield(); /* calls that may hold the old one */
    pthread_mutex_unlock(&binding);
    return ASCM_OK;
}

/* The slot an allocator pointer names, or NULL: compared as integers, so a
 * foreign pointer is never dereferenced. */
static acl_slot *slot_of(void *allocator) {
    uintptr_t a = (uintptr_t)allocator, base = (uintptr_t)slots;
    if (a < base || a >= base + sizeof(slots) || (a - base) % sizeof(acl_slot)) return NULL;
    return &slots[(a - base) / sizeof(acl_slot)];
}

/* The slot's device, entered (release with leave()), or NULL. */
static ascm_device *enter(acl_slot *s, unsigned *phase) {
    *phase = atomic_load(&s->phase);
    _Atomic uint64_t *users = ascm_stripe_of(s->users[*phase]);
    atomic_fetch_add(users, 1);
    ascm_device *d = atomic_load(&s->device);
    if (d && ascm_device_enter(d)) return d;
    atomic_fetch_sub(users, 1);
    return NULL;
}

static void leave(acl_slot *s, ascm_device *d, unsigned phase) {
    ascm_device_leave(d);
    atomic_fetch_sub(ascm_stripe_of(s->users[phase]), 1);
}

EXPORT void *ascmem_acl_alloc(void *allocator, size_t size) {
    acl_slot *s = slot_of(allocator);
    unsigned phase;
    ascm_device *d = s && size ? enter(s, &phase) : NULL;
    if (!d) return NULL;
    uint64_t addr = 0;
    int kind, events;
    /* aclrtMalloc's rules and its default policy (huge pages first) */
    int st = ascm_device_malloc_entered(d, (uint64_t)size, 0, ASCM_SIZE_MALLOC, &addr, &kind, &events);
    leave(s, d, phase);
    return st == ASCM_OK ? (void *)(uintptr_t)addr : NULL;
}

EXPORT void ascmem_acl_free(void *allocator, void *block) {
    acl_slot *s = slot_of(allocator);
    unsigned phase;
    ascm_device *d = s && block ? enter(s, &phase) : NULL;
    if (!d) return;
    int kind;
    /* a block that is not live on this device is refused by the pool */
    (void)ascm_device_free_entered(d, (uint64_t)(uintptr_t)block, ascm_kind_mask(ASCM_FREE_DEVICE), &kind);
    leave(s, d, phase);
}

/* The address is advice (the runtime's docs: "apply for a block according to
 * the suggested address"); ascmem places blocks itself and does not follow
 * it.  The block is still a valid one of the requested size. */
EXPORT void *ascmem_acl_alloc_advise(void *allocator, size_t size, void *addr) {
    (void)addr;
    return ascmem_acl_alloc(allocator, size);
}

EXPORT void *ascmem_acl_get_addr_from_block(void *block) { return block; }

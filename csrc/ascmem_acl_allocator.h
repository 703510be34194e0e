/* ascmem's callbacks for CANN's external allocator (aclrtAllocatorRegister;
 * prototypes from acl_rt_allocator.h, where aclrtAllocator,
 * aclrtAllocatorBlock and aclrtAllocatorAddr are void *).  They are exported
 * by ascmem's extension module (ascmem.acl_allocator.library_path()); the
 * allocator object comes from Python: ascmem.acl_allocator.allocator_object(
 * device).  A block is the device address, so get_addr_from_block returns it.
 * Safe to call from any thread, without the GIL.  docs/EMBEDDING.md shows the
 * registration in C. */
#ifndef ASCMEM_ACL_ALLOCATOR_H
#define ASCMEM_ACL_ALLOCATOR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* size bytes by aclrtMalloc's rules, or NULL (no room, size 0, a bad or
 * unbound allocator object) */
void *ascmem_acl_alloc(void *allocator, size_t size);
/* gives a block back; anything that is not a live block of the allocator's
 * device is ignored */
void ascmem_acl_free(void *allocator, void *block);
/* as ascmem_acl_alloc: the suggested address is not followed */
void *ascmem_acl_alloc_advise(void *allocator, size_t size, void *addr);
void *ascmem_acl_get_addr_from_block(void *block);

#ifdef __cplusplus
}
#endif

#endif /* ASCMEM_ACL_ALLOCATOR_H */

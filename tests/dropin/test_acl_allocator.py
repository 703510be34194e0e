"""CANN's external allocator: ascmem's exported callbacks called through the
prototypes of acl_rt_allocator.h from a compiled C program on several
threads, and register_allocator / unregister_allocator against the recording
stand-in of pyACL with a failure injected at every step."""
import ctypes
import os
import shutil
import subprocess
import sysconfig

import pytest

import ascmem
from ascmem import _core, acl, acl_allocator as aa
from ascmem.errors import (ACL_ERROR_BAD_ALLOC, ACL_ERROR_INVALID_PARAM,
                           ACL_ERROR_RT_FEATURE_NOT_SUPPORT, ACL_SUCCESS)

import fake_acl

# The types and callback typedefs of acl_rt_allocator.h / acl_base.h, written
# out (CANN's headers are not installed here): assigning ascmem's functions to
# these pointer types makes the compiler check the prototypes.
CALLER = r"""
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include "ascmem_acl_allocator.h"

typedef void *aclrtAllocator;
typedef void *aclrtAllocatorBlock;
typedef void *aclrtAllocatorAddr;
typedef void *(*aclrtAllocatorAllocFunc)(aclrtAllocator allocator, size_t size);
typedef void (*aclrtAllocatorFreeFunc)(aclrtAllocator allocator, aclrtAllocatorBlock block);
typedef void *(*aclrtAllocatorAllocAdviseFunc)(aclrtAllocator allocator, size_t size,
                                               aclrtAllocatorAddr addr);
typedef void *(*aclrtAllocatorGetAddrFromBlockFunc)(aclrtAllocatorBlock block);

static const aclrtAllocatorAllocFunc alloc_fn = ascmem_acl_alloc;
static const aclrtAllocatorFreeFunc free_fn = ascmem_acl_free;
static const aclrtAllocatorAllocAdviseFunc advise_fn = ascmem_acl_alloc_advise;
static const aclrtAllocatorGetAddrFromBlockFunc addr_fn = ascmem_acl_get_addr_from_block;

typedef struct { aclrtAllocator allocator; int iters, id, errors, allocated; } job;

/* each thread keeps up to 16 blocks, fills each with its own byte and checks
 * it before the free: two threads handed overlapping blocks would see it */
static void *work(void *arg) {
    job *j = arg;
    aclrtAllocatorBlock live[16] = {0};
    size_t sizes[16] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(j->id + 1);
    for (int i = 0; i < j->iters; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int k = (int)(x % 16);
        if (live[k]) {
            unsigned char *p = addr_fn(live[k]);
            for (size_t b = 0; b < sizes[k]; b += 61)
                if (p[b] != (unsigned char)j->id) j->errors++;
            free_fn(j->allocator, live[k]);
            live[k] = NULL;
        } else {
            size_t n = 64 + (size_t)(x >> 20) % 200000;
            live[k] = (x & 1) ? alloc_fn(j->allocator, n) : advise_fn(j->allocator, n, NULL);
            if (!live[k]) { j->errors++; continue; }
            j->allocated++;
            sizes[k] = n;
            memset(addr_fn(live[k]), j->id, n);
        }
    }
    for (int k = 0; k < 16; k++) if (live[k]) free_fn(j->allocator, live[k]);
    return NULL;
}

int hammer(void *allocator, int threads, int iters, int *allocated) {
    pthread_t t[32];
    job jobs[32];
    int errors = 0;
    *allocated = 0;
    for (int i = 0; i < threads; i++) {
        jobs[i] = (job){allocator, iters, i + 1, 0, 0};
        pthread_create(&t[i], NULL, work, &jobs[i]);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        errors += jobs[i].errors;
        *allocated += jobs[i].allocated;
    }
    return errors;
}

/* what a runtime handing ascmem bad input gets: NULLs and ignored frees */
int bad_input(void *allocator) {
    int wrong = 0;
    char local;
    wrong += alloc_fn(NULL, 64) != NULL;
    wrong += alloc_fn(&local, 64) != NULL;                       /* not an allocator */
    wrong += alloc_fn((char *)allocator + 1, 64) != NULL;         /* inside one */
    wrong += alloc_fn(allocator, 0) != NULL;
    wrong += alloc_fn(allocator, (size_t)-1) != NULL;             /* no device has that */
    free_fn(allocator, NULL);
    free_fn(allocator, &local);                                   /* not a block */
    free_fn(&local, &local);
    void *b = alloc_fn(allocator, 1000);
    wrong += b == NULL || addr_fn(b) != b;
    free_fn(allocator, (char *)b + 64);                           /* interior */
    free_fn(allocator, b);
    free_fn(allocator, b);                                        /* double */
    return wrong;
}
"""


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("acl_allocator")
    src = d / "caller.c"
    src.write_text(CALLER)
    lib = d / "libcaller.so"
    core = os.path.abspath(_core.__file__)
    # linked against the extension itself: the loader resolves the callbacks
    # by name, as an application linking ascmem's library would
    subprocess.run([cc, "-O1", "-std=c11", "-shared", "-fPIC", "-pthread",
                    "-Werror=incompatible-pointer-types", "-o", str(lib), str(src),
                    f"-I{ascmem.get_include()}", core, f"-Wl,-rpath,{os.path.dirname(core)}"],
                   check=True)
    return ctypes.CDLL(str(lib))


@pytest.fixture
def host():
    d = ascmem.Device("atlas-training", backend="host")  # real memory: the C side writes it
    yield d
    d.close()


def test_prototypes_compile_and_many_threads_share_one_device(caller, host):
    handle = aa.allocator_object(host)
    try:
        allocated = ctypes.c_int()
        errors = caller.hammer(ctypes.c_void_p(handle), 8, 3000, ctypes.byref(allocated))
        assert errors == 0
        assert allocated.value > 8 * 1000
    finally:
        aa.release_allocator_object(host)
    host.check()
    s = host.stats()
    assert s["huge"]["live_count"] + s["normal"]["live_count"] == 0
    assert s["normal"]["alloc_count"] + s["huge"]["alloc_count"] == allocated.value


def test_bad_input_through_the_prototypes_is_refused(caller, host):
    handle = aa.allocator_object(host)
    try:
        assert caller.bad_input(ctypes.c_void_p(handle)) == 0
    finally:
        aa.release_allocator_object(host)
    host.check()
    assert host.stats()["normal"]["live_count"] == 0


def test_an_unbound_allocator_serves_nothing(caller, host):
    handle = aa.allocator_object(host)
    aa.release_allocator_object(host)
    fns = aa.functions()
    assert fns[aa.ALLOC](handle, 4096) is None
    assert aa.function_addresses()[aa.ALLOC] == ctypes.cast(fns[aa.ALLOC], ctypes.c_void_p).value


def test_devices_get_their_own_allocator_objects():
    a, b = ascmem.Device("atlas-training"), ascmem.Device("atlas-training", device_id=1)
    ha, hb = aa.allocator_object(a), aa.allocator_object(b)
    try:
        assert ha != hb and aa.allocator_object(a) == ha  # one object per device, counted
        aa.release_allocator_object(a)
        alloc = aa.functions()[aa.ALLOC]
        pa, pb = alloc(ha, 4096), alloc(hb, 4096)
        assert a.kind_of(pa) is not None and b.kind_of(pb) is not None
        aa.functions()[aa.FREE](ha, pa)
        aa.functions()[aa.FREE](hb, pb)
    finally:
        aa.release_allocator_object(a)
        aa.release_allocator_object(b)
    assert not aa._slots


# ---- registration through pyACL (the recording stand-in) ----------------------------------

STEPS = ["rt.allocator_create_desc", "rt.allocator_set_obj_to_desc",
         "rt.allocator_set_alloc_func_to_desc", "rt.allocator_set_free_func_to_desc",
         "rt.allocator_set_alloc_advise_func_to_desc",
         "rt.allocator_set_get_addr_from_block_func_to_desc", "rt.allocator_register"]


@pytest.fixture
def dev():
    d = ascmem.Device("atlas-a2-training")
    yield d
    assert not aa._slots and not aa.registered_streams()


def test_register_then_the_runtime_allocates_from_the_device(dev):
    fake = fake_acl.make()
    assert acl.register_allocator("s0", dev, module=fake) == ACL_SUCCESS
    assert [c[0] for c in fake.calls] == STEPS  # the runtime's documented order
    desc, obj, alloc, free, advise, get_addr, ret = fake.rt.allocator_get_by_stream("s0")
    assert ret == ACL_SUCCESS
    block = alloc(obj, 1 << 20)                  # as the runtime calls its callbacks
    assert get_addr(block) == block and dev.usable_size(block) >= 1 << 20
    other = advise(obj, 4096, block)
    assert other and other != block
    free(obj, block)
    free(obj, other)
    dev.check()
    assert dev.stats()["huge"]["live_count"] + dev.stats()["normal"]["live_count"] == 0
    assert acl.unregister_allocator("s0") == ACL_SUCCESS
    assert fake.calls[-2:] == [("rt.allocator_unregister", "s0"), ("rt.allocator_destroy_desc", desc)]
    assert not fake.descs and not fake.registered
    # twice: nothing to do, success (allocator.cpp lines 179-186)
    assert acl.unregister_allocator("s0") == ACL_SUCCESS


@pytest.mark.parametrize("step", STEPS)
def test_a_step_that_fails_undoes_the_ones_before(dev, step):
    code = 507899
    fake = fake_acl.make(fail=lambda name, size: code if name == step else 0)
    ret = acl.register_allocator("s1", dev, module=fake)
    assert ret == (ACL_ERROR_BAD_ALLOC if step == "rt.allocator_create_desc" else code)
    assert not fake.descs and not fake.registered  # the descriptor was destroyed
    undo = [] if step == "rt.allocator_create_desc" else ["rt.allocator_destroy_desc"]
    assert [c[0] for c in fake.calls] == STEPS[:STEPS.index(step) + 1] + undo
    dev.check()


def test_unregister_refused_by_the_runtime_changes_nothing(dev):
    fake = fake_acl.make()
    assert acl.register_allocator("s2", dev, module=fake) == ACL_SUCCESS
    fake.fail = lambda name, size: 507000 if name == "rt.allocator_unregister" else 0
    assert acl.unregister_allocator("s2") == 507000
    assert fake.registered and aa.registered_streams() == ["s2"]
    fake.fail = None
    assert acl.unregister_allocator("s2") == ACL_SUCCESS


def test_registering_a_stream_again_keeps_the_last(dev):
    fake = fake_acl.make()
    other = ascmem.Device("atlas-a2-training", device_id=1)
    assert acl.register_allocator("s3", dev, module=fake) == ACL_SUCCESS
    first = fake.registered["s3"]
    assert acl.register_allocator("s3", other, module=fake) == ACL_SUCCESS
    assert fake.registered["s3"] != first and first not in fake.descs
    _, obj, alloc, free, *_ = fake.rt.allocator_get_by_stream("s3")
    block = alloc(obj, 4096)
    assert other.kind_of(block) is not None
    free(obj, block)
    assert acl.unregister_allocator("s3") == ACL_SUCCESS


def test_what_cannot_register(dev):
    fake = fake_acl.make()
    assert acl.register_allocator(None, dev, module=fake) == ACL_ERROR_INVALID_PARAM
    small = ascmem.Device("atlas-200i-a2")  # no aclrtAllocatorRegister on this product
    assert acl.register_allocator("s4", small, module=fake) == ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert acl.register_allocator("s4", dev, module=object()) == ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert not fake.calls


def test_the_installed_module_is_the_default(dev):
    fake = fake_acl.make()
    acl.install(fake)
    acl.use(dev)
    try:
        assert acl.register_allocator("s5") == ACL_SUCCESS
        assert fake.registered["s5"]
        assert acl.unregister_allocator("s5") == ACL_SUCCESS
    finally:
        acl.use(None)
        acl.uninstall()


def test_header_is_installed():
    assert os.path.exists(os.path.join(ascmem.get_include(), "ascmem_acl_allocator.h"))
    assert sysconfig.get_config_var("EXT_SUFFIX") in _core.__file__

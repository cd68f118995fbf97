/*
 * bind.c: pin a rank's thread next to its GPU: the CPUs and the memory of the NUMA node that
 * holds the GPU's PCI device, as hwloc discovers this machine. Cross-socket traffic for the host
 * side of a step (pinned copies, NCCL's proxy thread, the data loader) is what this avoids.
 * Memory binding is best effort: containers often forbid it, and the CPU binding alone still
 * helps; the result says which of the two held.
 */
#include "topo.h"
#include "topo_hwloc.h"

#include <stdio.h>

/* Bind to the cpuset and nodeset of `o` (a normal object); fill the report. */
static enum moe_status bind_to(hwloc_topology_t t, hwloc_obj_t o, struct topo_binding *b,
                               struct moe_error *err)
{
    if (hwloc_set_cpubind(t, o->cpuset, HWLOC_CPUBIND_THREAD) != 0)
        return moe_error_set(err, MOE_ERR_RUNTIME, "hwloc could not bind this thread to CPUs");
    b->memory_bound = hwloc_set_membind(t, o->nodeset, HWLOC_MEMBIND_BIND,
                                        HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) == 0;
    hwloc_bitmap_list_snprintf(b->cpus, sizeof b->cpus, o->cpuset);
    hwloc_obj_t numa = NULL;
    while ((numa = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, numa)))
        if (hwloc_bitmap_isincluded(numa->nodeset, o->nodeset)) break;
    b->numa_node = numa ? (int)numa->os_index : -1;
    return MOE_OK;
}

static enum moe_status loaded(hwloc_topology_t *t, struct moe_error *err)
{
    enum moe_status st = topo_hwloc_open(t, err);
    if (st != MOE_OK) return st;
    if (hwloc_topology_load(*t) != 0) {
        hwloc_topology_destroy(*t);
        return moe_error_set(err, MOE_ERR_RUNTIME, "hwloc could not discover this machine");
    }
    return MOE_OK;
}

enum moe_status topo_bind_near_pci(const char *busid, struct topo_binding *b, struct moe_error *err)
{
    hwloc_topology_t t;
    enum moe_status st = loaded(&t, err);
    if (st != MOE_OK) return st;
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t, busid);
    hwloc_obj_t near = dev ? hwloc_get_non_io_ancestor_obj(t, dev) : NULL;
    if (!near)
        st = moe_error_set(err, MOE_ERR_RUNTIME,
                           "bind: hwloc sees no PCI device %s on this machine", busid);
    else
        st = bind_to(t, near, b, err);
    hwloc_topology_destroy(t);
    return st;
}

enum moe_status topo_bind_numa(int node, struct topo_binding *b, struct moe_error *err)
{
    hwloc_topology_t t;
    enum moe_status st = loaded(&t, err);
    if (st != MOE_OK) return st;
    hwloc_obj_t o = NULL;
    while ((o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, o)))
        if ((int)o->os_index == node) break;
    if (!o)
        st = moe_error_set(err, MOE_ERR_INPUT, "bind: this machine has no NUMA node %d", node);
    else
        st = bind_to(t, o, b, err);
    hwloc_topology_destroy(t);
    return st;
}

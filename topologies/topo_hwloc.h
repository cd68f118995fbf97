/*
 * topo_hwloc.h: hwloc helpers shared by the files of topologies/ (internal: not for other
 * modules, which see only topo.h).
 */
#ifndef TOPO_HWLOC_H
#define TOPO_HWLOC_H

#include <hwloc.h>

#include "topo.h"

/* A topology handle that keeps every PCI device and Misc object. */
enum moe_status topo_hwloc_open(hwloc_topology_t *out, struct moe_error *err);
bool topo_hwloc_is_gpu(hwloc_obj_t o);
void topo_hwloc_busid(hwloc_obj_t o, char *buf, size_t cap);
enum moe_status topo_hwloc_read_node(hwloc_topology_t topo, struct topo_node *out,
                                     const char *where, struct moe_error *err);
/* Info attributes of a GPU's PCI object: GPUModel, GPUMemory (bytes), NVLinkLinks/Version. */
enum moe_status topo_hwloc_add_gpu_info(hwloc_obj_t gpu, const char *model, double memory_bytes,
                                        int nvlink_links, int nvlink_version);
/* The NVLinkBandwidth matrix (MB/s per direction): each GPU's links to one NVSwitch object
 * (added when any is non-zero) and direct GPU-GPU links (n x n, may be NULL). */
enum moe_status topo_hwloc_add_nvlink(hwloc_topology_t topo, hwloc_obj_t *gpus, int ngpus,
                                      const double *gpu_to_switch_mbps,
                                      const double *gpu_to_gpu_mbps, struct moe_error *err);
/* Export as XML, atomically. */
enum moe_status topo_hwloc_export(hwloc_topology_t topo, const char *file, struct moe_error *err);

#endif

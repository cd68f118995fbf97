/*
 * topo.h: the one public header of topologies/: where a model is trained.
 *
 * This module owns everything about hardware: GPU specs, cluster descriptions, per-node hwloc
 * XML and discovery of the local machine through hwloc. It is the only module that includes
 * hwloc.h.
 */
#ifndef TOPO_H
#define TOPO_H

#include "moe_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "2.9.0 (API 0x20800)": the hwloc this binary was built against and the API it runs with. */
void topo_hwloc_version(char *buf, size_t cap);
/* False when the hwloc library loaded at run time has another major API than the headers. */
bool topo_hwloc_abi_ok(void);

#ifdef __cplusplus
}
#endif

#endif /* TOPO_H */

/*
 * hwloc_info.c: which hwloc this binary uses.
 *
 * hwloc's ABI changes with its major API version; a binary built against 2.x must not run with a
 * 1.x or 3.x library, so moeplan checks it before touching a topology.
 */
#include "topo.h"

#include <hwloc.h>

void topo_hwloc_version(char *buf, size_t cap)
{
    unsigned api = hwloc_get_api_version();
    snprintf(buf, cap, "%s (API 0x%x)", HWLOC_VERSION, api);
}

bool topo_hwloc_abi_ok(void)
{
    return (hwloc_get_api_version() >> 16) == (HWLOC_API_VERSION >> 16);
}

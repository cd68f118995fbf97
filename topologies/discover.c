/*
 * discover.c: `moeplan topo discover`: this machine as a node XML and a cluster.
 *
 * hwloc finds packages, NUMA nodes, cores and PCI devices; NVIDIA GPUs are PCI devices of vendor
 * 0x10de (Debian's hwloc has no CUDA or NVML backend). NVML, loaded with dlopen so that moeplan
 * has no link-time dependency on the driver, adds each GPU's model, memory, active NVLink links
 * and where they lead (another GPU or an NVSwitch), and the fabric's cluster UUID and clique id:
 * GPUs of NVL72 trays that share a cluster UUID and clique are one NVLink domain. The CUDA
 * runtime's view (gathered by the executor and handed in) fills in where NVML is absent.
 *
 * The NVML declarations below are the documented C ABI of libnvidia-ml.so.1 for the calls used.
 */
#include "topo.h"
#include "topo_hwloc.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvml_return;
typedef struct nvml_device *nvml_device;
struct nvml_pci {
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};
struct nvml_memory {
    unsigned long long total, free, used;
};
struct nvml_fabric {
    unsigned char cluster_uuid[16];
    nvml_return status;
    unsigned clique_id;
    unsigned state;
};

struct nvml {
    void *lib;
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    nvml_return (*driver_version)(char *, unsigned);
    nvml_return (*count)(unsigned *);
    nvml_return (*handle)(unsigned, nvml_device *);
    nvml_return (*name)(nvml_device, char *, unsigned);
    nvml_return (*memory)(nvml_device, struct nvml_memory *);
    nvml_return (*pci)(nvml_device, struct nvml_pci *);
    nvml_return (*link_state)(nvml_device, unsigned, int *);
    nvml_return (*link_version)(nvml_device, unsigned, unsigned *);
    nvml_return (*link_remote_pci)(nvml_device, unsigned, struct nvml_pci *);
    nvml_return (*fabric)(nvml_device, struct nvml_fabric *); /* NULL on old drivers */
};

#define NVML_MAX_LINKS 18

static bool nvml_open(struct nvml *n)
{
    memset(n, 0, sizeof *n);
    n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) return false;
#define SYM(field, name) *(void **)(&n->field) = dlsym(n->lib, name)
    SYM(init, "nvmlInit_v2");
    SYM(shutdown, "nvmlShutdown");
    SYM(driver_version, "nvmlSystemGetDriverVersion");
    SYM(count, "nvmlDeviceGetCount_v2");
    SYM(handle, "nvmlDeviceGetHandleByIndex_v2");
    SYM(name, "nvmlDeviceGetName");
    SYM(memory, "nvmlDeviceGetMemoryInfo");
    SYM(pci, "nvmlDeviceGetPciInfo_v3");
    SYM(link_state, "nvmlDeviceGetNvLinkState");
    SYM(link_version, "nvmlDeviceGetNvLinkVersion");
    SYM(link_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    SYM(fabric, "nvmlDeviceGetGpuFabricInfo");
#undef SYM
    if (!n->init || !n->shutdown || !n->count || !n->handle || !n->name || !n->memory || !n->pci ||
        n->init() != 0) {
        dlclose(n->lib);
        n->lib = NULL;
        return false;
    }
    return true;
}

static void nvml_close(struct nvml *n)
{
    if (!n->lib) return;
    n->shutdown();
    dlclose(n->lib);
    n->lib = NULL;
}

/* "00000000:18:00.0" and "0000:18:00.0" name the same device. */
static bool busid_parse(const char *s, unsigned v[4])
{
    return sscanf(s, "%x:%x:%x.%x", &v[0], &v[1], &v[2], &v[3]) == 4;
}

static bool busid_equal(const char *a, const char *b)
{
    unsigned x[4], y[4];
    return busid_parse(a, x) && busid_parse(b, y) && memcmp(x, y, sizeof x) == 0;
}

/* What we learn of one GPU before it goes into the topology. */
struct found_gpu {
    hwloc_obj_t obj; /* its PCI object, NULL if hwloc did not see it */
    char busid[32], model[256];
    double memory_bytes;
    int links_to_switch, links_to_gpu[TOPO_MAX_GPUS_PER_NODE], nvlink_version;
};

static void nvml_probe(struct nvml *n, struct found_gpu *g, int *ng, struct topo_discovery *out)
{
    unsigned count = 0;
    if (n->driver_version) n->driver_version(out->driver, sizeof out->driver);
    if (n->count(&count) != 0) return;
    char remote[TOPO_MAX_GPUS_PER_NODE][NVML_MAX_LINKS][32];
    memset(remote, 0, sizeof remote);
    for (unsigned i = 0; i < count && *ng < TOPO_MAX_GPUS_PER_NODE; i++) {
        nvml_device dev;
        if (n->handle(i, &dev) != 0) continue;
        struct found_gpu *f = &g[*ng];
        memset(f, 0, sizeof *f);
        struct nvml_pci pci;
        struct nvml_memory mem;
        if (n->pci(dev, &pci) == 0) snprintf(f->busid, sizeof f->busid, "%s", pci.bus_id);
        if (n->name(dev, f->model, sizeof f->model) != 0) f->model[0] = '\0';
        if (n->memory(dev, &mem) == 0) f->memory_bytes = (double)mem.total;
        for (unsigned l = 0; n->link_state && l < NVML_MAX_LINKS; l++) {
            int active = 0;
            if (n->link_state(dev, l, &active) != 0 || !active) continue;
            out->nvlinks_active++;
            unsigned v = 0;
            if (n->link_version && n->link_version(dev, l, &v) == 0) f->nvlink_version = (int)v;
            struct nvml_pci rp;
            if (n->link_remote_pci && n->link_remote_pci(dev, l, &rp) == 0)
                snprintf(remote[*ng][l], sizeof remote[*ng][l], "%s", rp.bus_id);
            else
                snprintf(remote[*ng][l], sizeof remote[*ng][l], "?");
        }
        struct nvml_fabric fab;
        memset(&fab, 0, sizeof fab);
        if (n->fabric && n->fabric(dev, &fab) == 0 && fab.status == 0 &&
            !out->fabric_cluster_uuid[0]) {
            bool any = false;
            for (int k = 0; k < 16; k++) any |= fab.cluster_uuid[k] != 0;
            if (any) {
                char *p = out->fabric_cluster_uuid;
                for (int k = 0; k < 16; k++) p += sprintf(p, "%02x", fab.cluster_uuid[k]);
                out->fabric_clique_id = (int)fab.clique_id;
            }
        }
        (*ng)++;
    }
    /* A link whose far end is one of our GPUs is a direct link; any other end is a switch. */
    for (int i = 0; i < *ng; i++)
        for (int l = 0; l < NVML_MAX_LINKS; l++) {
            if (!remote[i][l][0]) continue;
            int peer = -1;
            for (int j = 0; j < *ng; j++)
                if (j != i && busid_equal(remote[i][l], g[j].busid)) peer = j;
            if (peer >= 0)
                g[i].links_to_gpu[peer]++;
            else
                g[i].links_to_switch++;
        }
}

enum moe_status topo_discover(const char *out_dir, const char *gpus_file,
                              const struct topo_cuda_gpu *cuda, int ncuda,
                              struct topo_discovery *out, struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    hwloc_topology_t t = NULL;
    struct nvml nv;
    struct topo_discovery d;
    memset(&d, 0, sizeof d);
    struct found_gpu g[TOPO_MAX_GPUS_PER_NODE];
    int ng = 0;
    struct topo_gpu_spec specs[64];
    int nspecs = 0;
    if ((st = topo_gpus_load(gpus_file, specs, 64, &nspecs, err))) return st;
    if ((st = topo_hwloc_open(&t, err))) return st;
    if (hwloc_topology_load(t) != 0) {
        hwloc_topology_destroy(t);
        return moe_error_set(err, MOE_ERR_RUNTIME, "hwloc could not discover this machine");
    }

    /* GPUs: NVML first, else the CUDA runtime's list, else hwloc's PCI devices alone. */
    d.nvml = nvml_open(&nv);
    if (d.nvml) {
        nvml_probe(&nv, g, &ng, &d);
        nvml_close(&nv);
    }
    if (ng == 0) {
        for (int i = 0; i < ncuda && ng < TOPO_MAX_GPUS_PER_NODE; i++, ng++) {
            memset(&g[ng], 0, sizeof g[ng]);
            snprintf(g[ng].busid, sizeof g[ng].busid, "%s", cuda[i].pci_busid);
            snprintf(g[ng].model, sizeof g[ng].model, "%s", cuda[i].name);
            g[ng].memory_bytes = cuda[i].memory_bytes;
        }
    }
    /* Match them to hwloc's PCI objects; GPUs only hwloc saw still count. */
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(t, o));) {
        if (!topo_hwloc_is_gpu(o)) continue;
        char busid[32];
        topo_hwloc_busid(o, busid, sizeof busid);
        bool matched = false;
        for (int i = 0; i < ng; i++)
            if (busid_equal(busid, g[i].busid)) {
                g[i].obj = o;
                matched = true;
            }
        if (!matched && ng < TOPO_MAX_GPUS_PER_NODE) {
            memset(&g[ng], 0, sizeof g[ng]);
            g[ng].obj = o;
            snprintf(g[ng].busid, sizeof g[ng].busid, "%s", busid);
            ng++;
        }
    }
    /* The NVLink matrix over the GPUs hwloc placed; bandwidth per link from the spec (the
     * driver does not report it). */
    hwloc_obj_t objs[TOPO_MAX_GPUS_PER_NODE];
    int placed[TOPO_MAX_GPUS_PER_NODE], nobj = 0;
    double to_switch[TOPO_MAX_GPUS_PER_NODE], per_link[TOPO_MAX_GPUS_PER_NODE];
    double direct[TOPO_MAX_GPUS_PER_NODE * TOPO_MAX_GPUS_PER_NODE];
    memset(direct, 0, sizeof direct);
    const struct topo_gpu_spec *spec = NULL;
    for (int i = 0; i < ng; i++) {
        const struct topo_gpu_spec *s = topo_gpu_find(specs, nspecs, g[i].model);
        if (s && !spec) spec = s;
        per_link[i] = s && s->nvlink_links ? s->nvlink_bytes_per_s / 1e6 / s->nvlink_links : 0;
        if (!g[i].obj) continue;
        topo_hwloc_add_gpu_info(g[i].obj, g[i].model, g[i].memory_bytes, g[i].links_to_switch,
                                g[i].nvlink_version);
        to_switch[nobj] = g[i].links_to_switch * per_link[i];
        placed[nobj] = i;
        objs[nobj++] = g[i].obj;
    }
    for (int a = 0; a < nobj; a++)
        for (int b = 0; b < nobj; b++)
            direct[a * nobj + b] = g[placed[a]].links_to_gpu[placed[b]] * per_link[placed[a]];
    if ((st = topo_hwloc_add_nvlink(t, objs, nobj, to_switch, direct, err))) goto cleanup;
    if (d.fabric_cluster_uuid[0]) {
        char clique[16];
        snprintf(clique, sizeof clique, "%d", d.fabric_clique_id);
        hwloc_obj_add_info(hwloc_get_root_obj(t), "NVLinkFabricClusterUUID", d.fabric_cluster_uuid);
        hwloc_obj_add_info(hwloc_get_root_obj(t), "NVLinkFabricCliqueId", clique);
    }
    if ((size_t)snprintf(d.xml_file, sizeof d.xml_file, "%s/local-node.xml", out_dir) >=
            sizeof d.xml_file ||
        (size_t)snprintf(d.cluster_file, sizeof d.cluster_file, "%s/local.json", out_dir) >=
            sizeof d.cluster_file) {
        st = moe_error_set(err, MOE_ERR_INPUT, "output folder path is too long");
        goto cleanup;
    }
    if ((st = topo_hwloc_export(t, d.xml_file, err))) goto cleanup;
    if ((st = topo_hwloc_read_node(t, &d.node, d.xml_file, err))) goto cleanup;

    if (ng > 0) {
        if (!spec) {
            st = moe_error_set(err, MOE_ERR_INPUT,
                               "found %d GPU(s) of model '%s', which %s does not describe: add its "
                               "spec there to write a cluster",
                               ng, g[0].model, gpus_file);
            goto cleanup;
        }
        struct topo_cluster c;
        memset(&c, 0, sizeof c);
        char host[64] = "localhost";
        gethostname(host, sizeof host - 1);
        snprintf(c.name, sizeof c.name, "local");
        time_t now = time(NULL);
        char date[32];
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
        snprintf(c.description, sizeof c.description,
                 "discovered by moeplan topo discover on %s, %s: %d x %s%s", host, date, ng,
                 spec->name, d.node.nics ? "" : "; no NIC found: scale-out is the datasheet NIC");
        c.gpu = *spec;
        snprintf(c.node_name, sizeof c.node_name, "%s", host);
        c.gpus_per_node = ng;
        c.cpu_sockets = d.node.packages > 0 ? d.node.packages : 1;
        c.cores_per_socket = d.node.cores / c.cpu_sockets;
        /* Some VMs show only part of their memory in the NUMA nodes: take the larger count. */
        double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        c.cpu_memory_bytes = d.node.memory_bytes > phys ? d.node.memory_bytes : phys;
        c.nics_per_node = d.node.nics;
        c.rails = d.node.nics;
        c.nic_bytes_per_s = spec->nic_bytes_per_s;
        snprintf(c.node_xml, sizeof c.node_xml, "%s", d.xml_file);
        c.nodes = 1;
        c.nodes_per_domain = 1;
        c.gpus_used_per_domain = ng;
        c.nvlink_bytes_per_s = d.nvlinks_active ? spec->nvlink_bytes_per_s : 0;
        c.nvlink_latency_us = 1.0;
        c.scale_out_bytes_per_s =
            d.node.nics ? spec->nic_bytes_per_s * d.node.nics / ng : spec->nic_bytes_per_s;
        c.oversubscription = 1.0;
        c.scale_out_latency_us = 5.0;
        topo_cluster_derive(&c);
        if ((st = topo_cluster_validate(&c, "discovered cluster", err))) goto cleanup;
        if ((st = topo_cluster_save(&c, d.cluster_file, err))) goto cleanup;
        d.wrote_cluster = true;
        d.node.ngpus = d.node.ngpus ? d.node.ngpus : ng;
        for (int i = 0; i < ng && i < TOPO_MAX_GPUS_PER_NODE; i++)
            if (!d.node.gpu[i].model[0]) {
                int n = snprintf(d.node.gpu[i].model, sizeof d.node.gpu[i].model, "%s", g[i].model);
                if (n < 0 || (size_t)n >= sizeof d.node.gpu[i].model) /* a long name is cut */
                    d.node.gpu[i].model[sizeof d.node.gpu[i].model - 1] = '\0';
                snprintf(d.node.gpu[i].pci_busid, sizeof d.node.gpu[i].pci_busid, "%s", g[i].busid);
                d.node.gpu[i].memory_bytes = g[i].memory_bytes;
                d.node.gpu[i].package = d.node.gpu[i].numa_node = -1;
            }
    }
    *out = d;
cleanup:
    hwloc_topology_destroy(t);
    return st;
}

/*
 * topo.h: the one public header of topologies/: where a model is trained.
 *
 * This module owns everything about hardware: GPU specs (topologies/gpus.json), cluster
 * descriptions (topologies/NAME.json, "moeplan.cluster"), per-node hwloc XML (topologies/xml/)
 * with the NVLink fabric as an hwloc distances matrix named "NVLinkBandwidth", and discovery of the
 * local machine through hwloc and, when present, NVML loaded with dlopen. It is the only module
 * that includes hwloc.h; no hwloc type crosses this header.
 *
 * Invariant: a struct topo_cluster returned by a load function has passed validation: positive
 * sizes, NVLink domains that fit the GPU's fabric, a known GPU model.
 */
#ifndef TOPO_H
#define TOPO_H

#include "moe_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOPO_NAME_MAX 64
#define TOPO_MAX_GPUS_PER_NODE 16
/* The largest cluster moeplan takes: about a million GPUs, more than any machine built; a
 * bound that keeps a plan's search and files small. */
#define TOPO_MAX_GPUS (1 << 20)
#define TOPO_CLUSTER_SCHEMA "moeplan.cluster"
#define TOPO_GPUS_SCHEMA "moeplan.gpus"
#define TOPO_SCHEMA_VERSION 1

/* "2.9.0 (API 0x20800)": the hwloc this binary was built against and the API it runs with. */
void topo_hwloc_version(char *buf, size_t cap);
/* False when the hwloc library loaded at run time has another major API than the headers. */
bool topo_hwloc_abi_ok(void);

/* ---------------------------------------------------------------------------------------------- */
/* GPU specs                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

/* Datasheet numbers of one GPU model, dense (no 2:4 sparsity), per GPU. */
struct topo_gpu_spec {
    char name[TOPO_NAME_MAX];                   /* "H200" */
    char arch[16];                              /* "hopper", "blackwell" */
    double bf16_tflops, fp8_tflops, fp4_tflops; /* 0: not supported */
    double hbm_bytes, hbm_bytes_per_s;
    int sms;
    double exp_per_s; /* exponentials a second (the softmax's MUFU.EX2); 0: not known */
    int nvlink_version, nvlink_links;
    double nvlink_bytes_per_s; /* per GPU per direction, all links */
    int nvlink_domain_gpus;    /* the largest NVLink domain the product builds (8 or 72) */
    double nic_bytes_per_s;    /* scale-out NIC per GPU */
    double power_w;
    char host_link[64];
    /* per GPU: the host link one way, and its share of the host's memory bandwidth (what an
     * optimizer offloaded to the CPU runs at); 0: not known */
    double host_link_bytes_per_s, host_memory_bytes_per_s;
    unsigned pci_device_id; /* 0: unknown */
};

/* Load every spec of a gpus.json. `specs` has room for `cap`. */
enum moe_status topo_gpus_load(const char *file, struct topo_gpu_spec *specs, int cap, int *n,
                               struct moe_error *err);
/* The spec whose name matches (case-insensitive; "NVIDIA H200" matches "H200"). */
const struct topo_gpu_spec *topo_gpu_find(const struct topo_gpu_spec *specs, int n,
                                          const char *name);

/* ---------------------------------------------------------------------------------------------- */
/* Clusters                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

struct topo_cluster {
    char name[TOPO_NAME_MAX];
    char description[256];
    struct topo_gpu_spec gpu;
    /* The node type (every node of a cluster is alike). */
    char node_name[TOPO_NAME_MAX];
    int gpus_per_node;
    int cpu_sockets, cores_per_socket;
    double cpu_memory_bytes;
    int nics_per_node, rails;
    double nic_bytes_per_s;      /* per NIC */
    char node_xml[MOE_PATH_MAX]; /* resolved path, "" when the cluster names none */
    int nodes;
    /* NVLink domains: consecutive groups of nodes_per_domain nodes; jobs use gpus_used of each. */
    int nodes_per_domain;
    int gpus_used_per_domain;
    double nvlink_bytes_per_s; /* per GPU per direction */
    double nvlink_latency_us;
    /* The scale-out fabric between domains. */
    double scale_out_bytes_per_s; /* per GPU per direction */
    double oversubscription;      /* >= 1: the fabric's taper */
    double scale_out_latency_us;
    /* Derived. */
    int domains;
    int gpus_total;  /* every GPU in the nodes */
    int gpus_usable; /* domains x gpus_used_per_domain: what plans may use */
};

/* Load and validate a cluster file; `gpus_file` holds the GPU specs it names. */
enum moe_status topo_cluster_load(struct topo_cluster *c, const char *file, const char *gpus_file,
                                  struct moe_error *err);
/* Validate a loaded document (used by `moeplan check`). */
enum moe_status topo_cluster_from_doc(struct topo_cluster *c, const struct moe_jdoc *doc,
                                      const char *gpus_file, struct moe_error *err);
/* A shipped name ("gb200-nvl72-x16", looked up as topo_dir/NAME.json) or a path. */
enum moe_status topo_cluster_resolve(struct topo_cluster *c, const char *spec, const char *topo_dir,
                                     struct moe_error *err);
/* The gpus.json for a cluster file: the one beside it, else topo_dir/gpus.json. */
void topo_gpus_file_for(const char *cluster_file, const char *topo_dir, char *buf, size_t cap);
/* Fill the derived counts (domains, gpus_total, gpus_usable) from the others. */
void topo_cluster_derive(struct topo_cluster *c);
enum moe_status topo_cluster_validate(const struct topo_cluster *c, const char *where,
                                      struct moe_error *err);
/* Write a cluster file (atomically). */
enum moe_status topo_cluster_save(const struct topo_cluster *c, const char *file,
                                  struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Node XML                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

struct topo_node_gpu {
    char pci_busid[32];
    char model[TOPO_NAME_MAX];
    double memory_bytes;
    int package;   /* the CPU package (socket) it hangs under, -1: unknown */
    int numa_node; /* os index of the nearest NUMA node, -1: unknown */
};

/* What a node XML (or the local machine) holds, as read back through hwloc. */
struct topo_node {
    int packages, numa_nodes, cores, pus;
    double memory_bytes;
    int ngpus;
    struct topo_node_gpu gpu[TOPO_MAX_GPUS_PER_NODE];
    int nics;
    int nvswitches;
    bool has_nvlink_matrix;
    /* GPU-to-GPU bandwidth in MB/s per direction after hwloc's transitive closure over the
     * NVSwitches (0: no NVLink between them). */
    double nvlink_mbps[TOPO_MAX_GPUS_PER_NODE][TOPO_MAX_GPUS_PER_NODE];
};

/* Load a node XML with hwloc. A file that is not well-formed XML is an input error at its line
 * and column; one hwloc refuses is an input error naming the file. */
enum moe_status topo_node_load_xml(struct topo_node *node, const char *file, struct moe_error *err);

/* What the generator builds: one node of a product, with its NVLink fabric. */
struct topo_node_desc {
    const char *name;
    int sockets, cores_per_socket;
    double memory_bytes_per_socket;
    const char *cpu_model;
    const struct topo_gpu_spec *gpu;
    int gpus;
    int nics;
    unsigned nic_pci_device_id;
    double nic_gbps;
};
/* The node types the shipped clusters use ("gb200-tray", "gb300-tray", "hgx-h100", "hgx-h200",
 * "dgx-b200"); NULL-terminated. */
extern const char *const topo_node_kinds[];
/* Fill `desc` for one of topo_node_kinds, with GPU specs from `specs`. */
enum moe_status topo_node_desc_get(struct topo_node_desc *desc, const char *kind,
                                   const struct topo_gpu_spec *specs, int nspecs,
                                   struct moe_error *err);
/* Build the node's hwloc topology (packages, cores, PCI GPUs and NICs with their info, an
 * NVSwitch and the NVLinkBandwidth matrix) and write it as XML, atomically. */
enum moe_status topo_node_generate_xml(const struct topo_node_desc *desc, const char *file,
                                       struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Discovery                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

/* What the CUDA runtime says of a GPU (the executor gathers it; topologies links no CUDA). */
struct topo_cuda_gpu {
    char name[256];
    char pci_busid[32];
    double memory_bytes;
    int sms, cc_major, cc_minor;
};

struct topo_discovery {
    struct topo_node node;
    bool nvml;                    /* libnvidia-ml was found and answered */
    char driver[32];              /* NVML's driver version */
    int nvlinks_active;           /* active NVLink links over all GPUs */
    char fabric_cluster_uuid[40]; /* "" when the GPUs report no fabric (not an NVL72 tray) */
    int fabric_clique_id;
    bool wrote_cluster;
    char xml_file[MOE_PATH_MAX], cluster_file[MOE_PATH_MAX];
};

/* Discover this machine: hwloc (packages, NUMA, cores, PCI GPUs and NICs), NVML when present
 * (model, memory, NVLink links and bandwidth, fabric cluster UUID and clique), the CUDA runtime's
 * view when `cuda` is given. Writes out_dir/local-node.xml and, when GPUs were found,
 * out_dir/local.json, a cluster the planner accepts. */
enum moe_status topo_discover(const char *out_dir, const char *gpus_file,
                              const struct topo_cuda_gpu *cuda, int ncuda,
                              struct topo_discovery *out, struct moe_error *err);

/* Binding a rank's thread (bind.c): to the CPUs and memory of the NUMA node of its GPU's PCI
 * device ("0000:18:00.0"), or of NUMA node `node`. memory_bound: whether the memory binding held
 * too (best effort: containers often forbid it). */
struct topo_binding {
    int numa_node; /* -1: hwloc names none */
    bool memory_bound;
    char cpus[256]; /* the CPU list bound to, "0-15" */
};
enum moe_status topo_bind_near_pci(const char *busid, struct topo_binding *b,
                                   struct moe_error *err);
enum moe_status topo_bind_numa(int node, struct topo_binding *b, struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* TOPO_H */

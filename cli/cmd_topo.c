/*
 * cmd_topo.c: `moeplan topo discover|show|list|check|generate`: clusters and node topologies.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "rpt.h"
#include "topo.h"
#ifdef MOEPLAN_HAVE_EXECUTOR
#include "exec.h"
#endif

enum { OPT_OUT = 'o' };

const struct cli_opt cmd_topo_opts[] = {
    {"output", required_argument, OPT_OUT, "PATH",
     "discover: folder for local.json and local-node.xml (.); generate: the XML file",
     CLI_OUT_EITHER},
    {NULL, 0, 0, NULL, NULL, 0},
};

static void topo_dir(const struct cli *cli, char *buf, size_t cap)
{
    cli_data_path(cli, "topologies", buf, cap);
}

/* The node XML's view: packages, cores, GPUs and their NVLink bandwidth. */
static void print_node(const struct topo_node *n, const char *label)
{
    char mem[32];
    moe_format_bytes(n->memory_bytes, mem, sizeof mem);
    printf("%s: %d packages, %d NUMA nodes, %d cores, %d PUs, %s memory; %d GPUs, %d NICs, "
           "%d NVSwitch objects\n",
           label, n->packages, n->numa_nodes, n->cores, n->pus, mem, n->ngpus, n->nics,
           n->nvswitches);
    if (n->ngpus == 0) return;
    const char *h[] = {"GPU", "PCI", "model", "memory", "package", "NUMA", "NVLink to others"};
    struct rpt_table *t = rpt_table_create(7, h, "llllrrl");
    for (int i = 0; t && i < n->ngpus; i++) {
        const struct topo_node_gpu *g = &n->gpu[i];
        double lo = 0, hi = 0;
        for (int j = 0; j < n->ngpus; j++) {
            if (j == i) continue;
            double v = n->nvlink_mbps[i][j];
            if (lo == 0 || v < lo) lo = v;
            if (v > hi) hi = v;
        }
        moe_format_bytes(g->memory_bytes, mem, sizeof mem);
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%d", i);
        rpt_table_cell(t, NULL, "%s", g->pci_busid);
        rpt_table_cell(t, NULL, "%s", g->model[0] ? g->model : "?");
        rpt_table_cell(t, NULL, "%s", g->memory_bytes > 0 ? mem : "?");
        rpt_table_cell(t, NULL, "%d", g->package);
        rpt_table_cell(t, NULL, "%d", g->numa_node);
        if (n->ngpus == 1)
            rpt_table_cell(t, NULL, "-");
        else if (hi == 0)
            rpt_table_cell(t, NULL, "none");
        else if (lo == hi)
            rpt_table_cell(t, NULL, "%.0f GB/s to each", hi / 1e3);
        else
            rpt_table_cell(t, NULL, "%.0f-%.0f GB/s", lo / 1e3, hi / 1e3);
    }
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);
}

static int topo_show(struct cli *cli, const char *spec)
{
    char dir[MOE_PATH_MAX];
    topo_dir(cli, dir, sizeof dir);
    struct topo_cluster c;
    struct moe_error err;
    if (topo_cluster_resolve(&c, spec, dir, &err) != MOE_OK) return cli_fail(cli, &err);
    const struct topo_gpu_spec *g = &c.gpu;
    char b[32];
    printf("%s: %s\n", c.name, c.description);
    printf("GPUs: %d usable of %d (%d nodes x %d %s); %d NVLink domain%s of %d node%s, %d GPUs "
           "used in each\n",
           c.gpus_usable, c.gpus_total, c.nodes, c.gpus_per_node, g->name, c.domains,
           c.domains == 1 ? "" : "s", c.nodes_per_domain, c.nodes_per_domain == 1 ? "" : "s",
           c.gpus_used_per_domain);
    printf("GPU %s (%s): %.0f TFLOPS bf16, %.0f fp8", g->name, g->arch, g->bf16_tflops,
           g->fp8_tflops);
    if (g->fp4_tflops > 0) printf(", %.0f fp4", g->fp4_tflops);
    char hbm[32];
    moe_format_bytes(g->hbm_bytes, hbm, sizeof hbm);
    printf(", %s HBM at %.2f TB/s, %d SMs, %.0f W\n", hbm, g->hbm_bytes_per_s / 1e12, g->sms,
           g->power_w);
    snprintf(b, sizeof b, "%.0f GB", c.cpu_memory_bytes / 1e9);
    printf("node %s: %d sockets x %d cores, %s CPU memory, %d NICs x %.0f Gb/s on %d rails\n",
           c.node_name, c.cpu_sockets, c.cores_per_socket, b, c.nics_per_node,
           c.nic_bytes_per_s * 8 / 1e9, c.rails);
    const char *h[] = {"tier", "scope", "bandwidth per GPU per direction", "latency"};
    struct rpt_table *t = rpt_table_create(4, h, "llrr");
    if (t) {
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "NVLink");
        rpt_table_cell(t, NULL, "%d GPUs per domain", c.gpus_used_per_domain);
        rpt_table_cell(t, NULL, "%.0f GB/s", c.nvlink_bytes_per_s / 1e9);
        rpt_table_cell(t, NULL, "%.1f us", c.nvlink_latency_us);
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "scale-out");
        rpt_table_cell(t, NULL, "%d domain%s, oversubscription %.1f", c.domains,
                       c.domains == 1 ? "" : "s", c.oversubscription);
        rpt_table_cell(t, NULL, "%.1f GB/s", c.scale_out_bytes_per_s / 1e9);
        rpt_table_cell(t, NULL, "%.1f us", c.scale_out_latency_us);
        rpt_table_print(t, stdout);
    }
    rpt_table_destroy(t);
    char total_hbm[32];
    moe_format_bytes(g->hbm_bytes * c.gpus_usable, total_hbm, sizeof total_hbm);
    printf("totals over %d usable GPUs: %.1f PFLOPS bf16, %s HBM, %.1f kW GPU power\n",
           c.gpus_usable, g->bf16_tflops * c.gpus_usable / 1e3, total_hbm,
           g->power_w * c.gpus_usable / 1e3);
    if (c.node_xml[0]) {
        struct topo_node n;
        if (topo_node_load_xml(&n, c.node_xml, &err) != MOE_OK) return cli_fail(cli, &err);
        printf("\n");
        print_node(&n, c.node_xml);
    }
    return 0;
}

static int topo_list(struct cli *cli)
{
    char dir[MOE_PATH_MAX];
    topo_dir(cli, dir, sizeof dir);
    struct moe_error err;
    char *names[128];
    int n = cli_list_json(dir, "gpus.json", names, 128, &err);
    if (n < 0) return cli_fail(cli, &err);
    const char *h[] = {"cluster",         "GPU",         "usable GPUs",   "domains",
                       "GPUs per domain", "NVLink GB/s", "scale-out GB/s"};
    struct rpt_table *t = rpt_table_create(7, h, "llrrrrr");
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char path[MOE_PATH_MAX * 2];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct topo_cluster c;
        if (topo_cluster_resolve(&c, path, dir, &err) != MOE_OK) {
            rc = cli_fail(cli, &err);
            continue;
        }
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", c.name);
        rpt_table_cell(t, NULL, "%s", c.gpu.name);
        rpt_table_cell(t, NULL, "%d", c.gpus_usable);
        rpt_table_cell(t, NULL, "%d", c.domains);
        rpt_table_cell(t, NULL, "%d", c.gpus_used_per_domain);
        rpt_table_cell(t, NULL, "%.0f", c.nvlink_bytes_per_s / 1e9);
        rpt_table_cell(t, NULL, "%.0f", c.scale_out_bytes_per_s / 1e9);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    return rc;
}

static int topo_discover_cmd(struct cli *cli, const char *out_dir)
{
    struct moe_error err;
    struct topo_cuda_gpu cuda[TOPO_MAX_GPUS_PER_NODE];
    int ncuda = 0;
#ifndef MOEPLAN_HAVE_EXECUTOR
    int rc = cli_gpu_exec(cli); /* the CUDA devices are the GPU part's to see */
    if (rc >= 0) return rc;
#else
    int count = 0;
    if (exec_device_count(&count, &err) == MOE_OK) {
        for (int i = 0; i < count && ncuda < TOPO_MAX_GPUS_PER_NODE; i++) {
            struct exec_device_info d;
            if (exec_device_query(i, &d, &err) != MOE_OK) continue;
            struct topo_cuda_gpu *c = &cuda[ncuda++];
            snprintf(c->name, sizeof c->name, "%s", d.name);
            snprintf(c->pci_busid, sizeof c->pci_busid, "%s", d.pci_bus_id);
            c->memory_bytes = d.memory_bytes;
            c->sms = d.sm_count;
            c->cc_major = d.cc_major;
            c->cc_minor = d.cc_minor;
        }
    }
#endif
    if (moe_output_dir_make(out_dir, &err) != MOE_OK) return cli_fail(cli, &err);
    char gpus[MOE_PATH_MAX];
    cli_data_path(cli, "topologies/gpus.json", gpus, sizeof gpus);
    struct topo_discovery d;
    if (topo_discover(out_dir, gpus, cuda, ncuda, &d, &err) != MOE_OK) return cli_fail(cli, &err);
    printf("hwloc: %s written\n", d.xml_file);
    if (d.nvml)
        printf("NVML: found, driver %s\n", d.driver);
    else
        printf("NVML: not found (no libnvidia-ml.so.1)\n");
    if (d.nvml)
        printf("NVLink: %d active links%s%s%s\n", d.nvlinks_active,
               d.fabric_cluster_uuid[0] ? "; fabric cluster " : "",
               d.fabric_cluster_uuid[0] ? d.fabric_cluster_uuid : "",
               d.fabric_cluster_uuid[0] ? "" : "; no NVLink fabric (not an NVL72 tray)");
#ifdef MOEPLAN_HAVE_EXECUTOR
    printf("CUDA runtime: %d device%s\n", ncuda, ncuda == 1 ? "" : "s");
    for (int i = 0; i < ncuda; i++)
        printf("  %d: %s, %.1f GB, %d SMs, compute %d.%d, PCI %s\n", i, cuda[i].name,
               cuda[i].memory_bytes / 1e9, cuda[i].sms, cuda[i].cc_major, cuda[i].cc_minor,
               cuda[i].pci_busid);
#else
    printf("CUDA runtime: not in this build\n");
#endif
    print_node(&d.node, "this machine");
    if (d.wrote_cluster) {
        printf("cluster: %s written; check it with 'moeplan topo show %s'\n", d.cluster_file,
               d.cluster_file);
    } else {
        printf("no NVIDIA GPU found on this machine: no cluster written\n");
    }
    return 0;
}

static int topo_generate(struct cli *cli, const struct cli_cmd *cmd, const char *kind,
                         const char *file)
{
    struct moe_error err;
    char gpus[MOE_PATH_MAX];
    cli_data_path(cli, "topologies/gpus.json", gpus, sizeof gpus);
    struct topo_gpu_spec specs[64];
    int n = 0;
    struct topo_node_desc desc;
    if (topo_gpus_load(gpus, specs, 64, &n, &err) != MOE_OK) return cli_fail(cli, &err);
    if (topo_node_desc_get(&desc, kind, specs, n, &err) != MOE_OK) {
        char list[256] = "";
        size_t used = 0;
        for (int i = 0; topo_node_kinds[i]; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     topo_node_kinds[i]);
        return cli_usage(cmd, "%s (kinds: %s)", err.message, list);
    }
    if (topo_node_generate_xml(&desc, file, &err) != MOE_OK) return cli_fail(cli, &err);
    printf("%s: %s node written\n", file, kind);
    return 0;
}

int cmd_topo(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *out = NULL;
    for (int i = 0; i < nargs; i++)
        if (args[i].val == OPT_OUT) out = args[i].value;
    if (optind >= argc) return cli_usage(cmd, "which action? discover, show, list, generate");
    const char *action = argv[optind];
    int operands = argc - optind - 1;
    if (strcmp(action, "discover") == 0) {
        if (operands != 0) return cli_usage(cmd, "'discover' takes no operand (use --output)");
        if (out && !strcmp(out, "-"))
            return cli_usage(cmd, "discover writes two files into a folder: --output - cannot "
                                  "hold them; name a folder");
        return topo_discover_cmd(cli, out ? out : ".");
    }
    if (out && (!strcmp(action, "show") || !strcmp(action, "list")))
        return cli_usage(cmd, "'%s' writes no file: --output goes with discover and generate",
                         action);
    if (strcmp(action, "show") == 0) {
        if (operands != 1) return cli_usage(cmd, "'show' takes one cluster");
        return topo_show(cli, argv[optind + 1]);
    }
    if (strcmp(action, "list") == 0) {
        if (operands != 0) return cli_usage(cmd, "'list' takes no operand");
        return topo_list(cli);
    }
    if (strcmp(action, "generate") == 0) {
        if (operands != 1 || !out) return cli_usage(cmd, "usage: topo generate KIND --output FILE");
        return topo_generate(cli, cmd, argv[optind + 1], out);
    }
    return cli_usage(cmd, "unknown action '%s' (discover, show, list, generate)", action);
}

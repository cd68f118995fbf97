/*
 * cluster.c: cluster descriptions ("moeplan.cluster"): nodes, NVLink domains, scale-out fabric.
 *
 * A cluster is N alike nodes. Consecutive groups of `nvlink_domain.nodes` nodes form one NVLink
 * domain (1 for an HGX node, 18 trays for an NVL72 rack), of which jobs use `gpus_used` GPUs
 * (64 of 72 is common on NVL72). Domains talk over the scale-out fabric. The GPU model is a name
 * from gpus.json, so a cluster file never repeats datasheet numbers; it may override the NVLink
 * and NIC bandwidths where a site differs.
 */
#include "topo.h"

#include <libgen.h>
#include <string.h>
#include <strings.h>

#define MAX_SPECS 64

/* gpus_file next to the cluster file when the caller gives none. */
static void default_gpus_file(const char *cluster_file, char *buf, size_t cap)
{
    char dir[MOE_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cluster_file);
    int n = snprintf(buf, cap, "%s/gpus.json", dirname(dir));
    if (n < 0 || (size_t)n >= cap) buf[cap - 1] = '\0';
}

void topo_cluster_derive(struct topo_cluster *c)
{
    c->domains = c->nodes_per_domain > 0 ? c->nodes / c->nodes_per_domain : 0;
    c->gpus_total = c->nodes * c->gpus_per_node;
    c->gpus_usable = c->domains * c->gpus_used_per_domain;
}

enum moe_status topo_cluster_from_doc(struct topo_cluster *c, const struct moe_jdoc *doc,
                                      const char *gpus_file, struct moe_error *err)
{
    static const char *const keys[] = {"schema", "version", "name",          "description", "gpu",
                                       "node",   "nodes",   "nvlink_domain", "scale_out",   NULL};
    static const char *const node_keys[] = {
        "name", "gpus",          "cpu_sockets", "cores_per_socket", "cpu_memory",
        "nics", "nic_bandwidth", "rails",       "hwloc_xml",        NULL};
    static const char *const dom_keys[] = {"nodes", "gpus_used", "bandwidth", "latency_us", NULL};
    static const char *const so_keys[] = {"bandwidth_per_gpu", "oversubscription", "latency_us",
                                          NULL};
    struct topo_cluster t;
    memset(&t, 0, sizeof t);
    struct moe_jval root, node, dom, so;
    char schema[64], gpu[TOPO_NAME_MAX], xml[MOE_PATH_MAX], gfile[MOE_PATH_MAX];
    int version;
    enum moe_status st;
    if ((st = moe_jdoc_schema(doc, schema, sizeof schema, &version, err))) return st;
    if ((st = moe_jdoc_root(doc, &root, err))) return st;
    if (strcmp(schema, TOPO_CLUSTER_SCHEMA) != 0)
        return moe_jval_error(&root, "schema", err, "expected \"%s\", got \"%s\"",
                              TOPO_CLUSTER_SCHEMA, schema);
    if (version != TOPO_SCHEMA_VERSION)
        return moe_jval_error(&root, "version", err, "this moeplan reads version %d, not %d",
                              TOPO_SCHEMA_VERSION, version);
    if ((st = moe_jval_keys(&root, keys, err))) return st;
    if ((st = moe_jval_str(&root, "name", true, NULL, t.name, sizeof t.name, err))) return st;
    if (!t.name[0]) return moe_jval_error(&root, "name", err, "must not be empty");
    if ((st = moe_jval_str(&root, "description", false, "", t.description, sizeof t.description,
                           err)))
        return st;

    /* The GPU model, from the spec file. */
    if ((st = moe_jval_str(&root, "gpu", true, NULL, gpu, sizeof gpu, err))) return st;
    if (gpus_file)
        snprintf(gfile, sizeof gfile, "%s", gpus_file);
    else
        default_gpus_file(doc->file, gfile, sizeof gfile);
    struct topo_gpu_spec specs[MAX_SPECS];
    int nspecs = 0;
    if ((st = topo_gpus_load(gfile, specs, MAX_SPECS, &nspecs, err))) return st;
    const struct topo_gpu_spec *g = topo_gpu_find(specs, nspecs, gpu);
    if (!g || strcasecmp(g->name, gpu) != 0) {
        char list[256] = "";
        size_t used = 0;
        for (int i = 0; i < nspecs && used < sizeof list - 16; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     specs[i].name);
        return moe_jval_error(&root, "gpu", err, "unknown GPU model '%s' (%s has: %s)", gpu, gfile,
                              list);
    }
    t.gpu = *g;

    /* The node type. */
    if ((st = moe_jval_object(&root, "node", true, &node, NULL, err))) return st;
    if ((st = moe_jval_keys(&node, node_keys, err))) return st;
    if ((st = moe_jval_str(&node, "name", true, NULL, t.node_name, sizeof t.node_name, err)))
        return st;
    if ((st = moe_jval_int32(&node, "gpus", true, 0, 1, TOPO_MAX_GPUS_PER_NODE, &t.gpus_per_node,
                             err)))
        return st;
    if ((st = moe_jval_int32(&node, "cpu_sockets", false, 2, 1, 64, &t.cpu_sockets, err)))
        return st;
    if ((st = moe_jval_int32(&node, "cores_per_socket", false, 0, 0, 4096, &t.cores_per_socket,
                             err)))
        return st;
    if ((st = moe_jval_size(&node, "cpu_memory", false, 0, 0, 1e15, &t.cpu_memory_bytes, err)))
        return st;
    if ((st = moe_jval_int32(&node, "nics", false, t.gpus_per_node, 0, 64, &t.nics_per_node, err)))
        return st;
    if ((st = moe_jval_bandwidth(&node, "nic_bandwidth", false, t.gpu.nic_bytes_per_s, 1e6, 1e15,
                                 &t.nic_bytes_per_s, err)))
        return st;
    if ((st = moe_jval_int32(&node, "rails", false, t.nics_per_node, 0, 64, &t.rails, err)))
        return st;
    if (t.rails > t.nics_per_node)
        return moe_jval_error(&node, "rails", err, "more rails (%d) than NICs (%d)", t.rails,
                              t.nics_per_node);
    if ((st = moe_jval_str(&node, "hwloc_xml", false, "", xml, sizeof xml, err))) return st;
    if (xml[0]) {
        /* Relative to the cluster file's folder. */
        char dir[MOE_PATH_MAX];
        snprintf(dir, sizeof dir, "%s", doc->file);
        int n = xml[0] == '/' ? snprintf(t.node_xml, sizeof t.node_xml, "%s", xml)
                              : snprintf(t.node_xml, sizeof t.node_xml, "%s/%s", dirname(dir), xml);
        if (n < 0 || (size_t)n >= sizeof t.node_xml)
            return moe_jval_error(&node, "hwloc_xml", err, "path is too long");
        /* Opened (not only looked at): the node XML is one of the command's inputs. */
        FILE *xf;
        struct moe_error xerr;
        if (moe_file_open_input(t.node_xml, &xf, &xerr) != MOE_OK)
            return moe_jval_error(&node, "hwloc_xml", err, "%s is not a readable regular file",
                                  t.node_xml);
        fclose(xf);
    }
    if ((st = moe_jval_int32(&root, "nodes", true, 0, 1, 1 << 20, &t.nodes, err))) return st;

    /* NVLink domains. */
    if ((st = moe_jval_object(&root, "nvlink_domain", true, &dom, NULL, err))) return st;
    if ((st = moe_jval_keys(&dom, dom_keys, err))) return st;
    if ((st = moe_jval_int32(&dom, "nodes", true, 0, 1, 1 << 20, &t.nodes_per_domain, err)))
        return st;
    int in_domain = t.nodes_per_domain * t.gpus_per_node;
    if ((st = moe_jval_int32(&dom, "gpus_used", false, in_domain, 1, 1 << 24,
                             &t.gpus_used_per_domain, err)))
        return st;
    if ((st = moe_jval_bandwidth(&dom, "bandwidth", false, t.gpu.nvlink_bytes_per_s, 0, 1e15,
                                 &t.nvlink_bytes_per_s, err)))
        return st;
    if ((st = moe_jval_num(&dom, "latency_us", false, 1.0, 0, 1e6, &t.nvlink_latency_us, err)))
        return st;
    if ((int64_t)t.nodes * t.gpus_per_node > TOPO_MAX_GPUS)
        return moe_jval_error(&root, "nodes", err,
                              "%d nodes x %d GPUs = %lld GPUs: moeplan takes clusters of at most "
                              "%d GPUs",
                              t.nodes, t.gpus_per_node, (long long)t.nodes * t.gpus_per_node,
                              TOPO_MAX_GPUS);
    if (t.nodes % t.nodes_per_domain != 0)
        return moe_jval_error(&dom, "nodes", err,
                              "the cluster's %d nodes do not split into domains of %d", t.nodes,
                              t.nodes_per_domain);
    if (t.gpus_used_per_domain > in_domain)
        return moe_jval_error(&dom, "gpus_used", err,
                              "a domain of %d nodes x %d GPUs has only %d GPUs", t.nodes_per_domain,
                              t.gpus_per_node, in_domain);
    if (in_domain > t.gpu.nvlink_domain_gpus)
        return moe_jval_error(&dom, "nodes", err, "%s NVLink domains hold at most %d GPUs, not %d",
                              t.gpu.name, t.gpu.nvlink_domain_gpus, in_domain);

    /* Scale-out fabric. */
    bool has_so = false;
    if ((st = moe_jval_object(&root, "scale_out", false, &so, &has_so, err))) return st;
    t.scale_out_bytes_per_s = t.nic_bytes_per_s * t.nics_per_node / t.gpus_per_node;
    t.oversubscription = 1.0;
    t.scale_out_latency_us = 5.0;
    if (has_so) {
        if ((st = moe_jval_keys(&so, so_keys, err))) return st;
        if ((st = moe_jval_bandwidth(&so, "bandwidth_per_gpu", false, t.scale_out_bytes_per_s, 0,
                                     1e15, &t.scale_out_bytes_per_s, err)))
            return st;
        if ((st = moe_jval_num(&so, "oversubscription", false, 1.0, 1.0, 1000.0,
                               &t.oversubscription, err)))
            return st;
        if ((st =
                 moe_jval_num(&so, "latency_us", false, 5.0, 0, 1e6, &t.scale_out_latency_us, err)))
            return st;
    }
    topo_cluster_derive(&t);
    if ((st = topo_cluster_validate(&t, doc->file, err))) return st;
    *c = t;
    return MOE_OK;
}

enum moe_status topo_cluster_validate(const struct topo_cluster *c, const char *where,
                                      struct moe_error *err)
{
    const char *w = where ? where : c->name;
    if (c->nodes < 1 || c->gpus_per_node < 1 || c->nodes_per_domain < 1 ||
        c->nodes % c->nodes_per_domain != 0)
        return moe_error_set_at(err, MOE_ERR_INPUT, w, 0, 0,
                                "nodes (%d) must split into NVLink domains of %d nodes", c->nodes,
                                c->nodes_per_domain);
    if (c->gpus_used_per_domain < 1 ||
        c->gpus_used_per_domain > c->nodes_per_domain * c->gpus_per_node)
        return moe_error_set_at(err, MOE_ERR_INPUT, w, 0, 0,
                                "gpus_used (%d) must be in [1, GPUs per domain]",
                                c->gpus_used_per_domain);
    if (!(c->nvlink_bytes_per_s >= 0) || !(c->scale_out_bytes_per_s > 0))
        return moe_error_set_at(err, MOE_ERR_INPUT, w, 0, 0, "link bandwidths must be positive");
    if (c->domains != c->nodes / c->nodes_per_domain ||
        c->gpus_usable != c->domains * c->gpus_used_per_domain)
        return moe_error_set_at(err, MOE_ERR_INPUT, w, 0, 0,
                                "derived counts do not match (call topo_cluster_derive first)");
    return MOE_OK;
}

enum moe_status topo_cluster_load(struct topo_cluster *c, const char *file, const char *gpus_file,
                                  struct moe_error *err)
{
    struct moe_jdoc doc;
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    st = topo_cluster_from_doc(c, &doc, gpus_file, err);
    moe_jdoc_free(&doc);
    return st;
}

void topo_gpus_file_for(const char *cluster_file, const char *topo_dir, char *buf, size_t cap)
{
    /* A cluster outside the shipped folder (a discovered local.json) names GPUs of the shipped
     * spec file unless it has its own gpus.json beside it. */
    default_gpus_file(cluster_file, buf, cap);
    if (moe_file_is_regular(buf)) return;
    int n = snprintf(buf, cap, "%s/gpus.json", topo_dir);
    if (n < 0 || (size_t)n >= cap) buf[cap - 1] = '\0';
}

enum moe_status topo_cluster_resolve(struct topo_cluster *c, const char *spec, const char *topo_dir,
                                     struct moe_error *err)
{
    char path[MOE_PATH_MAX], gpus[MOE_PATH_MAX];
    if (strchr(spec, '/') || strstr(spec, ".json")) {
        if ((size_t)snprintf(path, sizeof path, "%s", spec) >= sizeof path)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "the cluster path has %zu characters, more "
                                 "than the %zu allowed",
                                 strlen(spec), sizeof path - 1);
    } else {
        for (const char *p = spec; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
                return moe_error_set(err, MOE_ERR_INPUT, "'%s' is not a cluster name or a path",
                                     spec);
        int n = snprintf(path, sizeof path, "%s/%s.json", topo_dir, spec);
        if (n < 0 || (size_t)n >= sizeof path)
            return moe_error_set(err, MOE_ERR_INPUT, "topology directory path is too long");
        if (!moe_file_is_regular(path))
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "no cluster named '%s' (looked for %s; `moeplan topo list` shows "
                                 "the shipped ones)",
                                 spec, path);
    }
    topo_gpus_file_for(path, topo_dir, gpus, sizeof gpus);
    return topo_cluster_load(c, path, gpus, err);
}

enum moe_status topo_cluster_save(const struct topo_cluster *c, const char *file,
                                  struct moe_error *err)
{
    json_t *root = json_object(), *node = json_object(), *dom = json_object(), *so = json_object();
    if (!root || !node || !dom || !so) {
        json_decref(root);
        json_decref(node);
        json_decref(dom);
        json_decref(so);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory writing %s", file);
    }
    json_object_set_new(root, "name", json_string(c->name));
    json_object_set_new(root, "description", json_string(c->description));
    json_object_set_new(root, "gpu", json_string(c->gpu.name));
    json_object_set_new(node, "name", json_string(c->node_name));
    json_object_set_new(node, "gpus", json_integer(c->gpus_per_node));
    json_object_set_new(node, "cpu_sockets", json_integer(c->cpu_sockets));
    json_object_set_new(node, "cores_per_socket", json_integer(c->cores_per_socket));
    json_object_set_new(node, "cpu_memory", json_real(c->cpu_memory_bytes));
    json_object_set_new(node, "nics", json_integer(c->nics_per_node));
    json_object_set_new(node, "nic_bandwidth", json_real(c->nic_bytes_per_s));
    json_object_set_new(node, "rails", json_integer(c->rails));
    if (c->node_xml[0]) {
        /* Stored relative to the cluster file when they share a folder. */
        char a[MOE_PATH_MAX], b[MOE_PATH_MAX];
        snprintf(a, sizeof a, "%s", file);
        snprintf(b, sizeof b, "%s", c->node_xml);
        const char *xml_dir = dirname(b);
        bool same = strcmp(dirname(a), xml_dir) == 0;
        const char *base = strrchr(c->node_xml, '/');
        json_object_set_new(node, "hwloc_xml", json_string(same && base ? base + 1 : c->node_xml));
    }
    json_object_set_new(root, "node", node);
    json_object_set_new(root, "nodes", json_integer(c->nodes));
    json_object_set_new(dom, "nodes", json_integer(c->nodes_per_domain));
    json_object_set_new(dom, "gpus_used", json_integer(c->gpus_used_per_domain));
    json_object_set_new(dom, "bandwidth", json_real(c->nvlink_bytes_per_s));
    json_object_set_new(dom, "latency_us", json_real(c->nvlink_latency_us));
    json_object_set_new(root, "nvlink_domain", dom);
    json_object_set_new(so, "bandwidth_per_gpu", json_real(c->scale_out_bytes_per_s));
    json_object_set_new(so, "oversubscription", json_real(c->oversubscription));
    json_object_set_new(so, "latency_us", json_real(c->scale_out_latency_us));
    json_object_set_new(root, "scale_out", so);
    enum moe_status st =
        moe_json_write_atomic(file, root, TOPO_CLUSTER_SCHEMA, TOPO_SCHEMA_VERSION, err);
    json_decref(root);
    return st;
}

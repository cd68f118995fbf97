/*
 * node.c: one node's hardware through hwloc: load a node XML, generate the shipped ones, and
 * read a topology back into a struct topo_node.
 *
 * The NVLink fabric is kept the way hwloc's own NVML backend keeps it: the GPUs are PCI devices
 * (vendor 0x10de), a Misc object of subtype "NVSwitch" stands for the switched fabric, and a
 * heterogeneous distances matrix named "NVLinkBandwidth" (MB/s per direction) holds GPU <-> switch
 * links. hwloc's transitive closure turns that into GPU-to-GPU bandwidth, so whatever reads our
 * XML with hwloc (lstopo, Open MPI, us) sees the same fabric.
 *
 * hwloc reports no position for a bad XML file, so a small well-formedness scan runs first and
 * names the line and column of the first fault.
 */
#include "topo.h"
#include "topo_hwloc.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* Well-formedness, with positions                                                                */
/* ---------------------------------------------------------------------------------------------- */

struct xml_cursor {
    const char *p, *end;
    int line, col;
};

static void xc_step(struct xml_cursor *c)
{
    if (c->p >= c->end) return;
    if (*c->p == '\n') {
        c->line++;
        c->col = 1;
    } else if (((unsigned char)*c->p & 0xC0) != 0x80) {
        c->col++;
    }
    c->p++;
}

static bool xc_skip_to(struct xml_cursor *c, const char *marker)
{
    size_t n = strlen(marker);
    while (c->p + n <= c->end) {
        if (memcmp(c->p, marker, n) == 0) {
            for (size_t i = 0; i < n; i++) xc_step(c);
            return true;
        }
        xc_step(c);
    }
    return false;
}

static bool is_name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-' || ch == ':' || ch == '.';
}

/* Whether v (n bytes) is a bitmap as hwloc writes one: 32-bit words joined by commas, highest
 * first, each "0x" and 1 to 8 hex digits or empty (a zero word between others), the first
 * possibly "0xf...f" (every bit above set), neither the first nor the last empty. hwloc 2.9's
 * parser asserts on a leading comma (fuzz_xml). */
static bool bitmap_ok(const char *v, size_t n)
{
    for (size_t i = 0, word = 0;; word++) {
        size_t w0 = i;
        if (word == 0 && n >= 7 && !memcmp(v, "0xf...f", 7)) {
            i = 7;
        } else if (i + 2 <= n && v[i] == '0' && v[i + 1] == 'x') {
            size_t d0 = i += 2;
            while (i < n && isxdigit((unsigned char)v[i])) i++;
            if (i == d0 || i - d0 > 8) return false;
        }
        if (i == n) return i > w0; /* the last word not empty */
        if (v[i] != ',' || (word == 0 && i == w0)) return false;
        i++;
    }
}

/* The XML declaration "<?xml version=... encoding=... standalone=...?>", d0 at its '<' and e just
 * past its '>': each attribute known and once, its value quoted; an encoding other than UTF-8 or
 * US-ASCII refused (hwloc writes UTF-8, and whether it refuses another name or reads it as UTF-8
 * depends on its XML backend, libxml2 or its own). NULL when well formed; else the byte where it
 * is not, and why in msg. */
static const char *xml_decl_fault(const char *d0, const char *e, char *msg, size_t cap)
{
    static const char *const names[] = {"version", "encoding", "standalone"};
    static const char space[] = " \t\r\n";
    bool seen[3] = {false, false, false};
    const char *end = e - 2, *p = d0 + 5;
    if (e - d0 < 7 || memcmp(end, "?>", 2)) {
        snprintf(msg, cap, "the XML declaration ends with '?>'");
        return e - 1;
    }
    for (;;) {
        const char *ws = p;
        while (p < end && strchr(space, *p)) p++;
        if (p == end) return NULL;
        if (p == ws) {
            snprintf(msg, cap, "a space before each attribute of the XML declaration");
            return p;
        }
        const char *n0 = p;
        while (p < end && is_name_char(*p)) p++;
        size_t nl = (size_t)(p - n0);
        int k = -1;
        for (int i = 0; i < 3; i++)
            if (nl == strlen(names[i]) && !memcmp(n0, names[i], nl)) k = i;
        if (k < 0) {
            snprintf(msg, cap, "'%.*s': the XML declaration takes version, encoding and standalone",
                     (int)(nl == 0   ? 1
                           : nl < 40 ? nl
                                     : 40),
                     n0);
            return n0;
        }
        if (seen[k]) {
            snprintf(msg, cap, "%s given twice in the XML declaration", names[k]);
            return n0;
        }
        seen[k] = true;
        while (p < end && strchr(space, *p)) p++;
        if (p == end || *p != '=') {
            snprintf(msg, cap, "'=' expected after %s", names[k]);
            return p;
        }
        for (p++; p < end && strchr(space, *p);) p++;
        if (p == end || (*p != '"' && *p != '\'')) {
            snprintf(msg, cap, "the value of %s goes in quotes", names[k]);
            return p;
        }
        char quote = *p++;
        const char *v = p;
        while (p < end && *p != quote) p++;
        if (p == end) {
            snprintf(msg, cap, "the value of %s has no closing quote", names[k]);
            return v - 1;
        }
        size_t vl = (size_t)(p++ - v);
        if (k == 1 && !((vl == 5 && !strncasecmp(v, "UTF-8", 5)) ||
                        (vl == 8 && !strncasecmp(v, "US-ASCII", 8)))) {
            snprintf(msg, cap, "encoding '%.*s': a topology XML is UTF-8 (as hwloc writes it)",
                     (int)(vl < 40 ? vl : 40), v);
            return v;
        }
    }
}

/* Returns true when well-formed; else fills line, col and msg. */
static bool xml_well_formed(const char *text, size_t len, int *line, int *col, char *msg,
                            size_t cap)
{
    struct xml_cursor c = {text, text + len, 1, 1};
    char set_msg[160];
    int set_line = 0, set_col = 0;
    enum { DEPTH = 256 };
    const char *name[DEPTH];
    size_t name_len[DEPTH];
    int open_line[DEPTH], open_col[DEPTH], depth = 0, roots = 0;
#define FAULT(...)                                                                                 \
    do {                                                                                           \
        *line = c.line;                                                                            \
        *col = c.col;                                                                              \
        snprintf(msg, cap, __VA_ARGS__);                                                           \
        return false;                                                                              \
    } while (0)
    while (c.p < c.end) {
        if (*c.p != '<') {
            xc_step(&c);
            continue;
        }
        int tl = c.line, tc = c.col;
        if (c.end - c.p >= 4 && memcmp(c.p, "<!--", 4) == 0) {
            if (!xc_skip_to(&c, "-->")) FAULT("unterminated comment");
            continue;
        }
        if (c.end - c.p >= 2 && (c.p[1] == '?' || c.p[1] == '!')) {
            const char *d0 = c.p;
            if (!xc_skip_to(&c, ">")) FAULT("unterminated declaration");
            bool decl = c.p - d0 > 6 && !memcmp(d0, "<?xml", 5) && strchr(" \t\r\n", d0[5]);
            const char *at = decl ? xml_decl_fault(d0, c.p, msg, cap) : NULL;
            if (at) { /* its own line and column: the declaration may wrap */
                struct xml_cursor w = {d0, at, tl, tc};
                while (w.p < w.end) xc_step(&w);
                *line = w.line, *col = w.col;
                return false;
            }
            continue;
        }
        xc_step(&c);
        bool closing = c.p < c.end && *c.p == '/';
        if (closing) xc_step(&c);
        const char *n0 = c.p;
        while (c.p < c.end && is_name_char(*c.p)) xc_step(&c);
        size_t nlen = (size_t)(c.p - n0);
        if (nlen == 0) FAULT("a tag needs a name");
        if (closing) {
            while (c.p < c.end && (*c.p == ' ' || *c.p == '\t' || *c.p == '\n' || *c.p == '\r'))
                xc_step(&c);
            if (c.p >= c.end || *c.p != '>') FAULT("'>' expected to close </%.*s", (int)nlen, n0);
            if (depth == 0) FAULT("</%.*s> closes nothing", (int)nlen, n0);
            depth--;
            if (name_len[depth] != nlen || memcmp(name[depth], n0, nlen) != 0) {
                *line = tl;
                *col = tc;
                snprintf(msg, cap, "</%.*s> does not close <%.*s> opened at %d:%d", (int)nlen, n0,
                         (int)name_len[depth], name[depth], open_line[depth], open_col[depth]);
                return false;
            }
            xc_step(&c);
            continue;
        }
        /* Attributes until '>' or '/>'. An <object> must carry the sets hwloc 2.9 reads without
         * checking (a CPU-side object without its cpusets crashes its XML import). */
        bool self_closing = false, object = nlen == 6 && !memcmp(n0, "object", 6);
        unsigned sets = 0; /* bits: cpuset, complete_cpuset, nodeset, complete_nodeset */
        const char *type = NULL;
        size_t type_len = 0;
        for (;;) {
            while (c.p < c.end && (*c.p == ' ' || *c.p == '\t' || *c.p == '\n' || *c.p == '\r'))
                xc_step(&c);
            if (c.p >= c.end) FAULT("unexpected end of file inside <%.*s>", (int)nlen, n0);
            if (*c.p == '>') break;
            if (*c.p == '/') {
                xc_step(&c);
                if (c.p >= c.end || *c.p != '>') FAULT("'>' expected after '/'");
                self_closing = true;
                break;
            }
            const char *a0 = c.p;
            int al = c.line, ac = c.col;
            while (c.p < c.end && is_name_char(*c.p)) xc_step(&c);
            if (c.p == a0) FAULT("unexpected '%c' in <%.*s>", *c.p, (int)nlen, n0);
            size_t alen = (size_t)(c.p - a0);
            /* the four hwloc needs ([0..3], bits of sets), then the two it may have */
            static const char *const set_names[6] = {"cpuset",         "complete_cpuset",
                                                     "nodeset",        "complete_nodeset",
                                                     "allowed_cpuset", "allowed_nodeset"};
            bool is_set = false;
            for (int k = 0; object && k < 6; k++) {
                if (alen != strlen(set_names[k]) || memcmp(a0, set_names[k], alen)) continue;
                is_set = true;
                if (k < 4) sets |= 1u << k;
            }
            bool is_type = object && alen == 4 && !memcmp(a0, "type", 4);
            if (c.p >= c.end || *c.p != '=') FAULT("'=' expected after attribute name");
            xc_step(&c);
            if (c.p >= c.end || (*c.p != '"' && *c.p != '\''))
                FAULT("attribute value needs quotes");
            char q = *c.p;
            int ql = c.line, qc = c.col;
            xc_step(&c);
            const char *v0 = c.p;
            if (is_type) type = c.p;
            while (c.p < c.end && *c.p != q) {
                if (*c.p == '<')
                    FAULT("'<' inside an attribute value (quote opened at %d:%d)", ql, qc);
                xc_step(&c);
            }
            if (c.p >= c.end) {
                *line = ql;
                *col = qc;
                snprintf(msg, cap, "unterminated attribute value");
                return false;
            }
            if (is_type) type_len = (size_t)(c.p - type);
            if (is_set && !bitmap_ok(v0, (size_t)(c.p - v0))) {
                *line = al;
                *col = ac;
                snprintf(msg, cap,
                         "%.*s=\"%.*s\" is not an hwloc bitmap (0x-prefixed hex words of 32 bits "
                         "joined by commas, as hwloc writes them)",
                         (int)alen, a0, (int)(c.p - v0 < 48 ? c.p - v0 : 48), v0);
                return false;
            }
            xc_step(&c);
        }
        if (object && type) {
            static const char *const io[] = {"Bridge", "PCIDev", "OSDev", "Misc"};
            bool cpu_side = true;
            for (int k = 0; k < 4; k++)
                if (type_len == strlen(io[k]) && !memcmp(type, io[k], type_len)) cpu_side = false;
            bool numa = (type_len == 8 && !memcmp(type, "NUMANode", 8)) ||
                        (type_len == 7 && !memcmp(type, "Machine", 7));
            unsigned need = cpu_side ? (numa ? 15u : 3u) : 0u;
            if (cpu_side && (sets & 12u)) need |= 12u; /* a nodeset comes with its complete one */
            if ((sets & need) != need && !set_line) {  /* told once the syntax is good */
                set_line = tl;
                set_col = tc;
                snprintf(set_msg, sizeof set_msg,
                         "<object type=\"%.*s\"> lacks %s (hwloc needs %s)",
                         (int)(type_len < 32 ? type_len : 32), type,
                         !(sets & 1u)   ? "cpuset"
                         : !(sets & 2u) ? "complete_cpuset"
                         : !(sets & 4u) ? "nodeset"
                                        : "complete_nodeset",
                         numa ? "the four cpusets and nodesets" : "cpuset and complete_cpuset");
            }
        }
        xc_step(&c); /* '>' */
        if (depth == 0) roots++;
        if (roots > 1) {
            *line = tl;
            *col = tc;
            snprintf(msg, cap, "a second top-level element");
            return false;
        }
        if (!self_closing) {
            if (depth == DEPTH) FAULT("elements nested too deep");
            name[depth] = n0;
            name_len[depth] = nlen;
            open_line[depth] = tl;
            open_col[depth] = tc;
            depth++;
        }
    }
    if (depth > 0) {
        *line = open_line[depth - 1];
        *col = open_col[depth - 1];
        snprintf(msg, cap, "<%.*s> is never closed", (int)name_len[depth - 1], name[depth - 1]);
        return false;
    }
    if (roots == 0) FAULT("no XML element");
#undef FAULT
    if (set_line) {
        *line = set_line;
        *col = set_col;
        snprintf(msg, cap, "%s", set_msg);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* Reading a topology back                                                                        */
/* ---------------------------------------------------------------------------------------------- */

bool topo_hwloc_is_gpu(hwloc_obj_t o)
{
    return o->type == HWLOC_OBJ_PCI_DEVICE && o->attr->pcidev.vendor_id == 0x10de &&
           (o->attr->pcidev.class_id >> 8) == 0x03;
}

static bool is_nic(hwloc_obj_t o)
{
    return o->type == HWLOC_OBJ_PCI_DEVICE && (o->attr->pcidev.class_id >> 8) == 0x02;
}

void topo_hwloc_busid(hwloc_obj_t o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%04x:%02x:%02x.%x", o->attr->pcidev.domain, o->attr->pcidev.bus,
             o->attr->pcidev.dev, o->attr->pcidev.func);
}

enum moe_status topo_hwloc_read_node(hwloc_topology_t topo, struct topo_node *out,
                                     const char *where, struct moe_error *err)
{
    struct topo_node n;
    memset(&n, 0, sizeof n);
    n.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    n.numa_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    n.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    n.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    for (int i = 0; i < n.numa_nodes; i++)
        n.memory_bytes +=
            (double)hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i)->attr->numanode.local_memory;
    hwloc_obj_t gpu_obj[TOPO_MAX_GPUS_PER_NODE];
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(topo, o));) {
        if (is_nic(o)) n.nics++;
        if (!topo_hwloc_is_gpu(o)) continue;
        if (n.ngpus == TOPO_MAX_GPUS_PER_NODE)
            return moe_error_set_at(err, MOE_ERR_INPUT, where, 0, 0,
                                    "more than %d GPUs in one node", TOPO_MAX_GPUS_PER_NODE);
        struct topo_node_gpu *g = &n.gpu[n.ngpus];
        gpu_obj[n.ngpus++] = o;
        topo_hwloc_busid(o, g->pci_busid, sizeof g->pci_busid);
        const char *model = hwloc_obj_get_info_by_name(o, "GPUModel");
        snprintf(g->model, sizeof g->model, "%s", model ? model : "");
        const char *mem = hwloc_obj_get_info_by_name(o, "GPUMemory");
        g->memory_bytes = mem ? strtod(mem, NULL) : 0.0;
        hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
        hwloc_obj_t pkg = anc ? hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, anc) : NULL;
        if (!pkg && anc && anc->type == HWLOC_OBJ_PACKAGE) pkg = anc;
        g->package = pkg ? (int)pkg->logical_index : -1;
        g->numa_node = anc && anc->nodeset ? hwloc_bitmap_first(anc->nodeset) : -1;
    }
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_MISC, o));)
        if (o->subtype && strcmp(o->subtype, "NVSwitch") == 0) n.nvswitches++;

    unsigned nr = 1;
    struct hwloc_distances_s *d = NULL;
    if (hwloc_distances_get_by_name(topo, "NVLinkBandwidth", &nr, &d, 0) == 0 && nr == 1) {
        n.has_nvlink_matrix = true;
        /* With switches, GPU pairs connect through them: take hwloc's closure. */
        if (n.nvswitches)
            hwloc_distances_transform(topo, d, HWLOC_DISTANCES_TRANSFORM_TRANSITIVE_CLOSURE, NULL,
                                      0);
        for (int i = 0; i < n.ngpus; i++)
            for (int j = 0; j < n.ngpus; j++) {
                hwloc_uint64_t v = 0, back = 0; /* the inline helper writes both */
                if (i != j &&
                    hwloc_distances_obj_pair_values(d, gpu_obj[i], gpu_obj[j], &v, &back) == 0)
                    n.nvlink_mbps[i][j] = (double)v;
            }
        hwloc_distances_release(topo, d);
    }
    *out = n;
    return MOE_OK;
}

/* hwloc loads its plugins (the libxml2 XML importer among them) with the first topology and
 * unloads them with the last. libxml2 keeps state of its own for its lifetime (what it learnt of
 * an encoding an XML named, for one); once the plugin is unloaded that state is unreachable, and
 * valgrind and LeakSanitizer report it as lost, from a module they can no longer name. One
 * topology, made once and never destroyed, holds the plugins for the life of the process (and
 * spares each node XML a plugin load and unload). */
static void hold_plugins(void)
{
    static hwloc_topology_t held;
    hwloc_topology_init(&held); /* failing, it holds nothing, and the next one fails alike */
}

enum moe_status topo_hwloc_open(hwloc_topology_t *out, struct moe_error *err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hold_plugins);
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0)
        return moe_error_set(err, MOE_ERR_RUNTIME, "hwloc_topology_init failed");
    /* Keep every PCI device and our Misc objects: GPUs, NICs and NVSwitches live there. */
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
    hwloc_topology_set_type_filter(t, HWLOC_OBJ_MISC, HWLOC_TYPE_FILTER_KEEP_ALL);
    *out = t;
    return MOE_OK;
}

/* hwloc's XML import is not safe on hostile input (2.9 dereferences missing sets and asserts on a
 * bitmap with a leading comma: fuzz_xml found them, and the checks above now refuse them first).
 * The text is imported once in a child process first; a child that dies makes the file invalid
 * input, not a crash of ours. */
static enum moe_status hwloc_trial(const char *text, size_t len, const char *file,
                                   struct moe_error *err)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return MOE_OK; /* no child: the checks above stand alone */
    if (pid == 0) {
        /* a crash kills the child, whatever handler the process had (a host's, a fuzzer's), and
         * hwloc's messages are the parent's import's to print, once */
        static const int fatal[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
        for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) signal(fatal[i], SIG_DFL);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, STDOUT_FILENO), dup2(null, STDERR_FILENO);
        hwloc_topology_t t;
        struct moe_error e;
        int ok = topo_hwloc_open(&t, &e) == MOE_OK &&
                 hwloc_topology_set_xmlbuffer(t, text, (int)len + 1) == 0 &&
                 hwloc_topology_load(t) == 0;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return MOE_OK;
    if (WIFSIGNALED(status))
        return moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                                "hwloc crashed reading this topology XML (signal %d): a malformed "
                                "or incomplete object",
                                WTERMSIG(status));
    return MOE_OK; /* a rejection is reported by the import itself */
}

enum moe_status topo_node_load_xml(struct topo_node *node, const char *file, struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    char *text = NULL;
    hwloc_topology_t t = NULL;
    size_t len;
    if ((st = moe_file_read(file, MOE_READ_INPUT, MOE_JSON_MAX_BYTES, &text, &len, err))) return st;
    int line = 0, col = 0;
    char msg[256];
    if (memchr(text, '\0', (size_t)len)) {
        st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0, "file contains a NUL byte");
        goto cleanup;
    }
    if (!xml_well_formed(text, (size_t)len, &line, &col, msg, sizeof msg)) {
        st = moe_error_set_at(err, MOE_ERR_INPUT, file, line, col, "%s", msg);
        goto cleanup;
    }
    if ((st = hwloc_trial(text, len, file, err))) goto cleanup;
    if ((st = topo_hwloc_open(&t, err))) goto cleanup;
    if (hwloc_topology_set_xmlbuffer(t, text, (int)len + 1) != 0 || hwloc_topology_load(t) != 0) {
        st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                              "hwloc rejects this topology XML (HWLOC_XML_VERBOSE=1 shows why)");
        goto cleanup;
    }
    st = topo_hwloc_read_node(t, node, file, err);
cleanup:
    if (t) hwloc_topology_destroy(t);
    free(text);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* The NVLink fabric and GPU facts, added to a topology                                           */
/* ---------------------------------------------------------------------------------------------- */

enum moe_status topo_hwloc_add_gpu_info(hwloc_obj_t gpu, const char *model, double memory_bytes,
                                        int nvlink_links, int nvlink_version)
{
    char buf[64];
    if (model && model[0]) hwloc_obj_add_info(gpu, "GPUModel", model);
    if (memory_bytes > 0) {
        snprintf(buf, sizeof buf, "%.0f", memory_bytes);
        hwloc_obj_add_info(gpu, "GPUMemory", buf);
    }
    if (nvlink_links > 0) {
        snprintf(buf, sizeof buf, "%d", nvlink_links);
        hwloc_obj_add_info(gpu, "NVLinkLinks", buf);
        snprintf(buf, sizeof buf, "%d", nvlink_version);
        hwloc_obj_add_info(gpu, "NVLinkVersion", buf);
    }
    return MOE_OK;
}

enum moe_status topo_hwloc_add_nvlink(hwloc_topology_t topo, hwloc_obj_t *gpus, int ngpus,
                                      const double *gpu_to_switch_mbps,
                                      const double *gpu_to_gpu_mbps, struct moe_error *err)
{
    if (ngpus < 1 || ngpus > TOPO_MAX_GPUS_PER_NODE) return MOE_OK;
    bool any_switch = false, any_direct = false;
    for (int i = 0; i < ngpus; i++) {
        any_switch |= gpu_to_switch_mbps && gpu_to_switch_mbps[i] > 0;
        for (int j = 0; gpu_to_gpu_mbps && j < ngpus; j++)
            any_direct |= gpu_to_gpu_mbps[i * ngpus + j] > 0;
    }
    if (!any_switch && !any_direct) return MOE_OK; /* no NVLink: no matrix */
    int n = ngpus + (any_switch ? 1 : 0);
    hwloc_obj_t objs[TOPO_MAX_GPUS_PER_NODE + 1];
    hwloc_uint64_t values[(TOPO_MAX_GPUS_PER_NODE + 1) * (TOPO_MAX_GPUS_PER_NODE + 1)];
    memset(values, 0, sizeof values);
    for (int i = 0; i < ngpus; i++) {
        objs[i] = gpus[i];
        for (int j = 0; gpu_to_gpu_mbps && j < ngpus; j++)
            values[i * n + j] = (hwloc_uint64_t)gpu_to_gpu_mbps[i * ngpus + j];
    }
    if (any_switch) {
        hwloc_obj_t sw =
            hwloc_topology_insert_misc_object(topo, hwloc_get_root_obj(topo), "NVSwitch");
        if (!sw) return moe_error_set(err, MOE_ERR_RUNTIME, "hwloc refused the NVSwitch object");
        sw->subtype = strdup("NVSwitch"); /* hwloc frees it with the object */
        objs[ngpus] = sw;
        for (int i = 0; i < ngpus; i++) {
            values[i * n + ngpus] = (hwloc_uint64_t)gpu_to_switch_mbps[i];
            values[ngpus * n + i] = (hwloc_uint64_t)gpu_to_switch_mbps[i];
        }
    }
    hwloc_distances_add_handle_t h = hwloc_distances_add_create(
        topo, "NVLinkBandwidth",
        HWLOC_DISTANCES_KIND_FROM_OS | HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH, 0);
    if (!h || hwloc_distances_add_values(topo, h, (unsigned)n, objs, values, 0) != 0 ||
        hwloc_distances_add_commit(topo, h, 0) != 0)
        return moe_error_set(err, MOE_ERR_RUNTIME, "hwloc refused the NVLinkBandwidth matrix");
    return MOE_OK;
}

enum moe_status topo_hwloc_export(hwloc_topology_t topo, const char *file, struct moe_error *err)
{
    char *buf = NULL;
    int len = 0;
    if (hwloc_topology_export_xmlbuffer(topo, &buf, &len, 0) != 0 || !buf)
        return moe_error_set(err, MOE_ERR_RUNTIME, "hwloc could not export %s", file);
    /* len counts the terminating NUL. */
    enum moe_status st = moe_file_write_atomic(file, buf, len > 0 ? (size_t)len - 1 : 0, err);
    hwloc_free_xmlbuffer(topo, buf);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* The shipped node types                                                                         */
/* ---------------------------------------------------------------------------------------------- */

const char *const topo_node_kinds[] = {"gb200-tray", "gb300-tray", "hgx-h100", "hgx-h200",
                                       "dgx-b200",   "dgx-b300",   NULL};

enum moe_status topo_node_desc_get(struct topo_node_desc *desc, const char *kind,
                                   const struct topo_gpu_spec *specs, int nspecs,
                                   struct moe_error *err)
{
    /* name, GPU, sockets x cores, memory per socket, CPU, GPUs, NICs, NIC device, Gb/s */
    static const struct {
        const char *name, *gpu;
        int sockets, cores;
        double mem;
        const char *cpu;
        int gpus, nics;
        unsigned nic_id;
        double gbps;
    } kinds[] = {
        {"gb200-tray", "GB200", 2, 72, 480e9, "NVIDIA Grace (Neoverse V2)", 4, 4, 0x1021, 400},
        {"gb300-tray", "GB300", 2, 72, 480e9, "NVIDIA Grace (Neoverse V2)", 4, 4, 0x1023, 800},
        {"hgx-h100", "H100", 2, 56, 1024e9, "Intel Xeon Platinum 8480+", 8, 8, 0x1021, 400},
        {"hgx-h200", "H200", 2, 56, 1024e9, "Intel Xeon Platinum 8480+", 8, 8, 0x1021, 400},
        {"dgx-b200", "B200", 2, 56, 2048e9, "Intel Xeon Platinum 8570", 8, 8, 0x1021, 400},
        {"dgx-b300", "B300", 2, 64, 1024e9, "Intel Xeon 6776P", 8, 8, 0x1023, 800},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(kinds[i].name, kind) != 0) continue;
        const struct topo_gpu_spec *g = topo_gpu_find(specs, nspecs, kinds[i].gpu);
        if (!g) return moe_error_set(err, MOE_ERR_INPUT, "no GPU spec '%s'", kinds[i].gpu);
        *desc = (struct topo_node_desc){
            kinds[i].name, kinds[i].sockets, kinds[i].cores,  kinds[i].mem, kinds[i].cpu, g,
            kinds[i].gpus, kinds[i].nics,    kinds[i].nic_id, kinds[i].gbps};
        return MOE_OK;
    }
    return moe_error_set(err, MOE_ERR_USAGE, "unknown node kind '%s'", kind);
}

/* Append to a growing string; false when out of memory. */
struct sbuf {
    char *s;
    size_t len, cap;
};

static bool sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool sb_printf(struct sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return false;
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return true;
        }
        size_t cap = b->cap ? b->cap * 2 : 65536;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) return false;
        b->s = s;
        b->cap = cap;
    }
}

/* "cpuset=... complete_cpuset=... nodeset=... complete_nodeset=..." for a CPU range and node. */
static bool sb_sets(struct sbuf *b, int first_pu, int npus, int numa_first, int nnuma)
{
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc(), nodes = hwloc_bitmap_alloc();
    char *cs = NULL, *ns = NULL;
    bool ok = cpus && nodes;
    if (ok) {
        hwloc_bitmap_set_range(cpus, (unsigned)first_pu, first_pu + npus - 1);
        hwloc_bitmap_set_range(nodes, (unsigned)numa_first, numa_first + nnuma - 1);
        ok = hwloc_bitmap_asprintf(&cs, cpus) >= 0 && hwloc_bitmap_asprintf(&ns, nodes) >= 0;
    }
    if (ok)
        ok = sb_printf(
            b, "cpuset=\"%s\" complete_cpuset=\"%s\" nodeset=\"%s\" complete_nodeset=\"%s\"", cs,
            cs, ns, ns);
    free(cs);
    free(ns);
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
    return ok;
}

/* The base XML: machine, packages with a NUMA node and cores each, and per package a host bridge
 * holding its share of the GPUs and NICs. */
static bool base_xml(const struct topo_node_desc *d, struct sbuf *b)
{
    int pus = d->sockets * d->cores_per_socket, gp = 1;
    bool ok = sb_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                           "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n<topology version=\"2.0\">\n"
                           "<object type=\"Machine\" os_index=\"0\" ");
    ok = ok && sb_sets(b, 0, pus, 0, d->sockets);
    ok = ok && sb_printf(b, " gp_index=\"%d\">\n<info name=\"moeplanNode\" value=\"%s\"/>\n", gp++,
                         d->name);
    int gpus_per_socket = d->gpus / d->sockets, nics_per_socket = d->nics / d->sockets;
    for (int s = 0; ok && s < d->sockets; s++) {
        int first = s * d->cores_per_socket;
        ok = sb_printf(b, "<object type=\"Package\" os_index=\"%d\" ", s) &&
             sb_sets(b, first, d->cores_per_socket, s, 1) &&
             sb_printf(b, " gp_index=\"%d\">\n<info name=\"CPUModel\" value=\"%s\"/>\n", gp++,
                       d->cpu_model) &&
             sb_printf(b, "<object type=\"NUMANode\" os_index=\"%d\" ", s) &&
             sb_sets(b, first, d->cores_per_socket, s, 1) &&
             sb_printf(b, " gp_index=\"%d\" local_memory=\"%.0f\"/>\n", gp++,
                       d->memory_bytes_per_socket);
        for (int c = 0; ok && c < d->cores_per_socket; c++) {
            int pu = first + c;
            ok = sb_printf(b, "<object type=\"Core\" os_index=\"%d\" ", pu) &&
                 sb_sets(b, pu, 1, s, 1) && sb_printf(b, " gp_index=\"%d\">\n", gp++) &&
                 sb_printf(b, "<object type=\"PU\" os_index=\"%d\" ", pu) &&
                 sb_sets(b, pu, 1, s, 1) && sb_printf(b, " gp_index=\"%d\"/>\n</object>\n", gp++);
        }
        /* Buses s*0x40 + 0x10.. for this socket's devices: a GPU and a NIC per PCIe switch slot. */
        int bus0 = s * 0x40;
        ok = ok && sb_printf(b,
                             "<object type=\"Bridge\" gp_index=\"%d\" bridge_type=\"0-1\" "
                             "depth=\"0\" bridge_pci=\"0000:[%02x-%02x]\">\n",
                             gp++, bus0, bus0 + 0x3f);
        int slots = gpus_per_socket > nics_per_socket ? gpus_per_socket : nics_per_socket;
        for (int k = 0; ok && k < slots; k++) {
            if (k < gpus_per_socket)
                ok = sb_printf(
                    b,
                    "<object type=\"PCIDev\" gp_index=\"%d\" pci_busid=\"0000:%02x:00.0\" "
                    "pci_type=\"0302 [10de:%04x] [10de:0000] a1\" "
                    "pci_link_speed=\"%.6f\"/>\n",
                    gp++, bus0 + 0x10 + 2 * k, d->gpu->pci_device_id, 63.015);
            if (ok && k < nics_per_socket)
                ok = sb_printf(
                    b,
                    "<object type=\"PCIDev\" gp_index=\"%d\" pci_busid=\"0000:%02x:00.0\" "
                    "pci_type=\"0207 [15b3:%04x] [15b3:0000] 00\" "
                    "pci_link_speed=\"%.6f\">\n<info name=\"NICBandwidthGbps\" "
                    "value=\"%.0f\"/>\n</object>\n",
                    gp++, bus0 + 0x11 + 2 * k, d->nic_pci_device_id, 63.015, d->nic_gbps);
        }
        ok = ok && sb_printf(b, "</object>\n</object>\n");
    }
    return ok && sb_printf(b, "</object>\n</topology>\n");
}

enum moe_status topo_node_generate_xml(const struct topo_node_desc *desc, const char *file,
                                       struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    struct sbuf b = {NULL, 0, 0};
    hwloc_topology_t t = NULL;
    if (desc->gpus > TOPO_MAX_GPUS_PER_NODE || desc->gpus % desc->sockets ||
        desc->nics % desc->sockets)
        return moe_error_set(err, MOE_ERR_INPUT, "%s: GPUs and NICs must split evenly over sockets",
                             desc->name);
    if (!base_xml(desc, &b)) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory building %s", file);
        goto cleanup;
    }
    if ((st = topo_hwloc_open(&t, err))) goto cleanup;
    if (hwloc_topology_set_xmlbuffer(t, b.s, (int)b.len + 1) != 0 || hwloc_topology_load(t) != 0) {
        st = moe_error_set(err, MOE_ERR_RUNTIME, "hwloc rejected the generated %s", desc->name);
        goto cleanup;
    }
    hwloc_obj_t gpus[TOPO_MAX_GPUS_PER_NODE];
    double mbps[TOPO_MAX_GPUS_PER_NODE];
    int n = 0;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(t, o)) && n < TOPO_MAX_GPUS_PER_NODE;) {
        if (!topo_hwloc_is_gpu(o)) continue;
        char model[TOPO_NAME_MAX + 8];
        snprintf(model, sizeof model, "NVIDIA %s", desc->gpu->name);
        topo_hwloc_add_gpu_info(o, model, desc->gpu->hbm_bytes, desc->gpu->nvlink_links,
                                desc->gpu->nvlink_version);
        mbps[n] = desc->gpu->nvlink_bytes_per_s / 1e6;
        gpus[n++] = o;
    }
    if ((st = topo_hwloc_add_nvlink(t, gpus, n, mbps, NULL, err))) goto cleanup;
    st = topo_hwloc_export(t, file, err);
cleanup:
    if (t) hwloc_topology_destroy(t);
    free(b.s);
    return st;
}

/*
 * test_topo.c: GPU specs, every shipped cluster and node XML, the NVLink matrix read back
 * through hwloc, the generator's reproducibility, discovery of this machine, binding a thread
 * next to a NUMA node or a PCI device, and bad input.
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "moe_test.h"

#include "topo.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

static void test_hwloc_version(void **state)
{
    (void)state;
    char buf[128];
    topo_hwloc_version(buf, sizeof buf);
    assert_true(buf[0] == '2' && buf[1] == '.');
    assert_non_null(strstr(buf, "(API 0x2"));
    assert_true(topo_hwloc_abi_ok());
}

static const char *gpus_file(void)
{
    static char path[1024];
    return moe_test_src(path, sizeof path, "topologies/gpus.json");
}

static void test_gpu_specs(void **state)
{
    (void)state;
    struct topo_gpu_spec s[16];
    int n = 0;
    struct moe_error err;
    assert_int_equal(topo_gpus_load(gpus_file(), s, 16, &n, &err), MOE_OK);
    assert_int_equal(n, 6);
    const struct topo_gpu_spec *h200 = topo_gpu_find(s, n, "H200");
    assert_non_null(h200);
    assert_true(h200->bf16_tflops == 989 && h200->fp8_tflops == 1979);
    assert_true(h200->hbm_bytes == 141.0 * (1 << 30) && h200->hbm_bytes_per_s == 4.8e12);
    assert_true(h200->nvlink_bytes_per_s == 450e9 && h200->nvlink_links == 18);
    assert_true(h200->nic_bytes_per_s == 50e9);
    assert_int_equal(h200->sms, 132);
    assert_int_equal(h200->pci_device_id, 0x2335);
    const struct topo_gpu_spec *gb300 = topo_gpu_find(s, n, "GB300");
    assert_true(gb300->hbm_bytes == 288.0 * (1 << 30) && gb300->nic_bytes_per_s == 100e9);
    assert_int_equal(gb300->nvlink_domain_gpus, 72);
    assert_true(gb300->fp4_tflops == 15000);
    /* Names as drivers report them. */
    assert_ptr_equal(topo_gpu_find(s, n, "NVIDIA H200"), h200);
    assert_string_equal(topo_gpu_find(s, n, "NVIDIA GB200")->name, "GB200");
    assert_string_equal(topo_gpu_find(s, n, "NVIDIA H100 80GB HBM3")->name, "H100");
    assert_string_equal(topo_gpu_find(s, n, "nvidia b200")->name, "B200");
    assert_null(topo_gpu_find(s, n, "NVIDIA A100-SXM4-80GB"));
    assert_null(topo_gpu_find(s, n, "H2000"));
}

static void test_shipped_clusters(void **state)
{
    (void)state;
    static const struct {
        const char *name, *gpu;
        int usable, total, domains, per_domain;
        double nvlink, scale_out;
    } want[] = {
        {"gb200-nvl72", "GB200", 72, 72, 1, 72, 900e9, 50e9},
        {"gb300-nvl72", "GB300", 72, 72, 1, 72, 900e9, 100e9},
        {"gb200-nvl72-x16", "GB200", 1024, 1152, 16, 64, 900e9, 50e9},
        {"gb300-nvl72-x16", "GB300", 1024, 1152, 16, 64, 900e9, 100e9},
        {"hgx-h100-x128", "H100", 1024, 1024, 128, 8, 450e9, 50e9},
        {"hgx-h200-x8", "H200", 8, 8, 1, 8, 450e9, 50e9},
        {"dgx-b200-x32", "B200", 256, 256, 32, 8, 900e9, 50e9},
        {"dgx-b300-x32", "B300", 256, 256, 32, 8, 900e9, 100e9},
    };
    char dir[1024];
    moe_test_src(dir, sizeof dir, "topologies");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        struct topo_cluster c;
        struct moe_error err;
        if (topo_cluster_resolve(&c, want[i].name, dir, &err) != MOE_OK)
            fail_msg("%s: %s", want[i].name, err.message);
        assert_string_equal(c.gpu.name, want[i].gpu);
        assert_int_equal(c.gpus_usable, want[i].usable);
        assert_int_equal(c.gpus_total, want[i].total);
        assert_int_equal(c.domains, want[i].domains);
        assert_int_equal(c.gpus_used_per_domain, want[i].per_domain);
        assert_true(c.nvlink_bytes_per_s == want[i].nvlink);
        assert_true(c.scale_out_bytes_per_s == want[i].scale_out);
        assert_true(c.node_xml[0] != '\0');
        /* The node XML it names agrees with it. */
        struct topo_node n;
        assert_int_equal(topo_node_load_xml(&n, c.node_xml, &err), MOE_OK);
        assert_int_equal(n.ngpus, c.gpus_per_node);
        assert_int_equal(n.packages, c.cpu_sockets);
        assert_int_equal(n.cores, c.cpu_sockets * c.cores_per_socket);
    }
}

/* Every shipped XML: hwloc loads it; the NVLinkBandwidth matrix through the NVSwitch reads back,
 * after hwloc's transitive closure, as the GPU's full NVLink bandwidth between every pair. */
static void test_node_xml_nvlink(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        int gpus, cores, nics;
        double mbps;
    } want[] = {
        {"topologies/xml/gb200-tray.xml", 4, 144, 4, 900000},
        {"topologies/xml/gb300-tray.xml", 4, 144, 4, 900000},
        {"topologies/xml/hgx-h100.xml", 8, 112, 8, 450000},
        {"topologies/xml/hgx-h200.xml", 8, 112, 8, 450000},
        {"topologies/xml/dgx-b200.xml", 8, 112, 8, 900000},
        {"topologies/xml/dgx-b300.xml", 8, 128, 8, 900000},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[1024];
        struct topo_node n;
        struct moe_error err;
        if (topo_node_load_xml(&n, moe_test_src(path, sizeof path, want[i].file), &err) != MOE_OK)
            fail_msg("%s: %s", want[i].file, err.message);
        assert_int_equal(n.ngpus, want[i].gpus);
        assert_int_equal(n.cores, want[i].cores);
        assert_int_equal(n.nics, want[i].nics);
        assert_int_equal(n.packages, 2);
        assert_int_equal(n.nvswitches, 1);
        assert_true(n.has_nvlink_matrix);
        for (int a = 0; a < n.ngpus; a++) {
            assert_true(n.gpu[a].memory_bytes > 70e9);
            assert_non_null(strstr(n.gpu[a].model, "NVIDIA "));
            /* half of the GPUs hang under each socket */
            assert_int_equal(n.gpu[a].package, a < n.ngpus / 2 ? 0 : 1);
            assert_int_equal(n.gpu[a].numa_node, a < n.ngpus / 2 ? 0 : 1);
            for (int b = 0; b < n.ngpus; b++)
                assert_true(n.nvlink_mbps[a][b] == (a == b ? 0 : want[i].mbps));
        }
    }
}

/* The shipped XML are the generator's output, byte for byte: they were not written by hand. */
static void test_generator_reproduces_shipped(void **state)
{
    (void)state;
    struct topo_gpu_spec s[16];
    int n = 0;
    struct moe_error err;
    assert_int_equal(topo_gpus_load(gpus_file(), s, 16, &n, &err), MOE_OK);
    for (int k = 0; topo_node_kinds[k]; k++) {
        struct topo_node_desc d;
        assert_int_equal(topo_node_desc_get(&d, topo_node_kinds[k], s, n, &err), MOE_OK);
        char tmp[] = "/tmp/moe_xml_XXXXXX";
        int fd = mkstemp(tmp);
        assert_true(fd >= 0);
        close(fd);
        assert_int_equal(topo_node_generate_xml(&d, tmp, &err), MOE_OK);
        char rel[256], shipped[1024], cmd[2200];
        snprintf(rel, sizeof rel, "topologies/xml/%s.xml", topo_node_kinds[k]);
        moe_test_src(shipped, sizeof shipped, rel);
        snprintf(cmd, sizeof cmd, "cmp -s %s %s", tmp, shipped);
        if (system(cmd) != 0) fail_msg("%s differs from a fresh generation", shipped);
        unlink(tmp);
    }
    struct topo_node_desc d;
    assert_int_equal(topo_node_desc_get(&d, "hgx-a100", s, n, &err), MOE_ERR_USAGE);
}

static void expect_bad_cluster(const char *rel, const char *needle, int line)
{
    char path[1024];
    struct topo_cluster c;
    struct moe_error err;
    memset(&c, 0, sizeof c);
    assert_int_equal(topo_cluster_load(&c, moe_test_src(path, sizeof path, rel), gpus_file(), &err),
                     MOE_ERR_INPUT);
    if (!strstr(err.message, needle)) fail_msg("%s: '%s' not in '%s'", rel, needle, err.message);
    assert_int_equal(err.line, line);
    assert_int_equal(c.nodes, 0); /* untouched */
}

static void test_bad_clusters(void **state)
{
    (void)state;
    expect_bad_cluster("tests/data/topo/bad-domain.json",
                       "H100 NVLink domains hold at most 8 GPUs, not 16", 8);
    expect_bad_cluster("tests/data/topo/bad-gpu.json", "unknown GPU model 'A100'", 5);
    expect_bad_cluster("tests/data/topo/bad-negative.json",
                       "nodes: must be in [1, 1048576], got -4", 7);
    expect_bad_cluster("tests/data/topo/bad-split.json", "20 nodes do not split into domains of 18",
                       8);
    expect_bad_cluster("tests/data/topo/bad-bandwidth.json", "node.nic_bandwidth: '400 furlongs'",
                       6);
}

/* The node XML rel refused as bad input, its message holding needle, at line:col where given
 * (0: not asserted) */
static void expect_bad_xml(const char *rel, const char *needle, int line, int col)
{
    char path[1024];
    struct topo_node n;
    struct moe_error err;
    assert_int_equal(topo_node_load_xml(&n, moe_test_src(path, sizeof path, rel), &err),
                     MOE_ERR_INPUT);
    if (!strstr(err.message, needle)) fail_msg("%s: '%s' not in '%s'", rel, needle, err.message);
    if (line) assert_int_equal(err.line, line);
    if (col) assert_int_equal(err.col, col);
}

static void test_bad_xml(void **state)
{
    (void)state;
    /* line 5: where the stray < stands */
    expect_bad_xml("tests/data/topo/bad-quote.xml",
                   "'<' inside an attribute value (quote opened at 4:37)", 5, 0);
    expect_bad_xml("tests/data/topo/bad-nesting.xml",
                   "</objekt> does not close <object> opened at 3:3", 4, 3);
    /* hwloc 2.9 crashes on an object without its cpusets (found by fuzz_xml): refused first */
    expect_bad_xml("tests/data/topo/missing-cpuset.xml",
                   "<object type=\"Core\"> lacks complete_cpuset", 5, 0);
    /* and asserts on a bitmap with a leading comma (fuzz_xml): refused first, where it stands */
    expect_bad_xml("tests/data/topo/bad-bitmap.xml",
                   "cpuset=\",0x00000003\" is not an hwloc bitmap", 5, 38);
    expect_bad_xml("tests/data/topo/not-hwloc.xml", "hwloc rejects this topology XML", 0, 0);
    struct topo_node n;
    struct moe_error err;
    assert_int_equal(topo_node_load_xml(&n, "/nonexistent.xml", &err), MOE_ERR_INPUT);
}

static void test_cluster_save_roundtrip(void **state)
{
    (void)state;
    char dir[1024];
    struct topo_cluster c, d;
    struct moe_error err;
    moe_test_src(dir, sizeof dir, "topologies");
    assert_int_equal(topo_cluster_resolve(&c, "gb300-nvl72-x16", dir, &err), MOE_OK);
    char tmp[] = "/tmp/moe_cluster_XXXXXX";
    assert_non_null(mkdtemp(tmp));
    char file[256];
    snprintf(file, sizeof file, "%s/c.json", tmp);
    assert_int_equal(topo_cluster_save(&c, file, &err), MOE_OK);
    assert_int_equal(topo_cluster_load(&d, file, gpus_file(), &err), MOE_OK);
    assert_int_equal(d.gpus_usable, c.gpus_usable);
    assert_int_equal(d.rails, c.rails);
    assert_true(d.scale_out_bytes_per_s == c.scale_out_bytes_per_s);
    assert_true(d.nvlink_bytes_per_s == c.nvlink_bytes_per_s);
    assert_string_equal(d.node_xml, c.node_xml);
    unlink(file);
    rmdir(tmp);
}

/* Discovery of this machine through hwloc: packages, cores, NUMA; GPUs where there are some. */
static void test_discover_here(void **state)
{
    (void)state;
    char tmp[] = "/tmp/moe_disc_XXXXXX";
    assert_non_null(mkdtemp(tmp));
    struct topo_discovery d;
    struct moe_error err;
    assert_int_equal(topo_discover(tmp, gpus_file(), NULL, 0, &d, &err), MOE_OK);
    assert_true(d.node.packages >= 1);
    assert_true(d.node.cores >= 1);
    assert_true(d.node.pus >= d.node.cores);
    assert_true(d.node.pus <= (int)sysconf(_SC_NPROCESSORS_ONLN)); /* hwloc shows allowed PUs */
    struct topo_node back;
    assert_int_equal(topo_node_load_xml(&back, d.xml_file, &err), MOE_OK);
    assert_int_equal(back.cores, d.node.cores);
    if (d.wrote_cluster) {
        struct topo_cluster c;
        assert_int_equal(topo_cluster_load(&c, d.cluster_file, gpus_file(), &err), MOE_OK);
        assert_int_equal(c.gpus_usable, d.node.ngpus);
        unlink(d.cluster_file);
    } else {
        assert_int_equal(d.node.ngpus, 0);
    }
    unlink(d.xml_file);
    rmdir(tmp);
}

/* "0-3,8,10-11" -> the CPUs in it. */
static bool cpu_listed(const char *list, int cpu)
{
    for (const char *p = list; *p;) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return false;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        if (cpu >= a && cpu <= b) return true;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    return false;
}

/* Binding this thread next to NUMA node 0 and next to a PCI device of this machine: the thread's
 * affinity is then exactly the CPUs reported. */
static void test_bind(void **state)
{
    (void)state;
    struct topo_binding b;
    struct moe_error err;
    assert_int_equal(topo_bind_numa(0, &b, &err), MOE_OK);
    printf("bound to NUMA node %d, CPUs %s, memory %s\n", b.numa_node, b.cpus,
           b.memory_bound ? "bound" : "not bound (not allowed here)");
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    for (int c = 0; c < CPU_SETSIZE; c++)
        assert_true(!!CPU_ISSET(c, &set) == cpu_listed(b.cpus, c));
    assert_int_equal(topo_bind_numa(4096, &b, &err), MOE_ERR_INPUT);
    assert_int_equal(topo_bind_near_pci("ffff:ff:1f.7", &b, &err), MOE_ERR_RUNTIME);
    printf("%s\n", err.message);
    DIR *d = opendir("/sys/bus/pci/devices");
    struct dirent *e = NULL;
    while (d && (e = readdir(d)) && e->d_name[0] == '.') {
    }
    const char *comp = getenv("HWLOC_COMPONENTS");
    if (e && !(comp && strstr(comp, "-pci"))) { /* the sanitizer run discovers without PCI */
        assert_int_equal(topo_bind_near_pci(e->d_name, &b, &err), MOE_OK);
        printf("near %s: NUMA node %d, CPUs %s\n", e->d_name, b.numa_node, b.cpus);
    }
    if (d) closedir(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hwloc_version),
        cmocka_unit_test(test_gpu_specs),
        cmocka_unit_test(test_shipped_clusters),
        cmocka_unit_test(test_node_xml_nvlink),
        cmocka_unit_test(test_generator_reproduces_shipped),
        cmocka_unit_test(test_bad_clusters),
        cmocka_unit_test(test_bad_xml),
        cmocka_unit_test(test_cluster_save_roundtrip),
        cmocka_unit_test(test_discover_here),
        cmocka_unit_test(test_bind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

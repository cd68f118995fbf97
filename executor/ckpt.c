/*
 * ckpt.c: checkpoints that survive a kill. A checkpoint is a folder DIR/step-NNNNNNNN holding one
 * file per (rank, part) and manifest.json, which names every file with its size and checksum
 * (FNV-1a, 64 bits) and is written after them; DIR/latest names the newest complete checkpoint and
 * is written last. Every file goes through moe_file_write_atomic (temp file, fsync, rename), so a
 * kill at any moment leaves the previous checkpoint whole and `latest` pointing at it.
 *
 * Loading checks the manifest's schema, the model name and parameter count, the step and the
 * ranks, then each file's size and checksum as it reads it: a corrupt, truncated or mismatched
 * checkpoint is refused naming the file (the buffers read so far are then not to be used).
 */
#include "exec_ref.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_SCHEMA "moeplan.checkpoint"

static uint64_t fnv1a(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

enum moe_status exec_ckpt_save(const char *dir, const struct exec_ckpt_id *id,
                               const struct exec_ckpt_part *parts, int nparts,
                               struct moe_error *err)
{
    char sub[MOE_PATH_MAX], path[MOE_PATH_MAX + 96];
    enum moe_status st = moe_output_dir_make(dir, err);
    if (st != MOE_OK) return st;
    snprintf(sub, sizeof sub, "%s/step-%08d", dir, id->step);
    if ((st = moe_output_dir_make(sub, err))) return st;
    json_t *root = json_object(), *files = json_array();
    json_object_set_new(root, "model", json_string(id->model));
    json_object_set_new(root, "nparams", json_integer((json_int_t)id->nparams));
    json_object_set_new(root, "step", json_integer(id->step));
    json_object_set_new(root, "rank", json_integer(id->rank));
    json_object_set_new(root, "ranks", json_integer(id->ranks));
    for (int i = 0; i < nparts && st == MOE_OK; i++) {
        snprintf(path, sizeof path, "%s/rank%d-%s.bin", sub, id->rank, parts[i].name);
        st = moe_file_write_atomic(path, parts[i].data, parts[i].bytes, err);
        json_t *f = json_object();
        char sum[24];
        snprintf(sum, sizeof sum, "%016llx",
                 (unsigned long long)fnv1a(parts[i].data, parts[i].bytes));
        json_object_set_new(f, "part", json_string(parts[i].name));
        json_object_set_new(f, "bytes", json_integer((json_int_t)parts[i].bytes));
        json_object_set_new(f, "fnv1a", json_string(sum));
        json_array_append_new(files, f);
    }
    json_object_set_new(root, "files", files);
    snprintf(path, sizeof path, "%s/manifest-rank%d.json", sub, id->rank);
    if (st == MOE_OK) st = moe_json_write_atomic(path, root, CKPT_SCHEMA, 1, err);
    json_decref(root);
    return st;
}

enum moe_status exec_ckpt_commit(const char *dir, int step, struct moe_error *err)
{
    char name[32], path[MOE_PATH_MAX + 16];
    int n = snprintf(name, sizeof name, "step-%08d\n", step);
    snprintf(path, sizeof path, "%s/latest", dir);
    return moe_file_write_atomic(path, name, (size_t)n, err);
}

enum moe_status exec_ckpt_latest(const char *dir, int *step, struct moe_error *err)
{
    char path[MOE_PATH_MAX + 16], buf[64] = {0};
    snprintf(path, sizeof path, "%s/latest", dir);
    char *text;
    size_t n;
    if (!moe_file_is_regular(path))
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0,
                                "no checkpoint to resume from (no such file)");
    enum moe_status st = moe_file_read(path, MOE_READ_OWN_STATE, sizeof buf - 1, &text, &n, err);
    if (st != MOE_OK) return st;
    memcpy(buf, text, n);
    free(text);
    char extra;
    if (n == 0 || sscanf(buf, "step-%d%c", step, &extra) != 2 || extra != '\n' || *step < 0)
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 1, 1, "not a checkpoint pointer");
    return MOE_OK;
}

/* The file of part i, read whole into buf (bytes), its size and checksum against the manifest. */
static enum moe_status load_part(const char *sub, int rank, const struct moe_jval *files, int i,
                                 struct exec_ckpt_part *part, struct moe_error *err)
{
    struct moe_jval f;
    char pname[64], sum[24], want[24], path[MOE_PATH_MAX + 96];
    int64_t bytes;
    enum moe_status st;
    if ((st = moe_jval_at_object(files, (size_t)i, &f, err)) ||
        (st = moe_jval_str(&f, "part", true, NULL, pname, sizeof pname, err)) ||
        (st = moe_jval_int(&f, "bytes", true, 0, 0, INT64_MAX, &bytes, err)) ||
        (st = moe_jval_str(&f, "fnv1a", true, NULL, want, sizeof want, err)))
        return st;
    if (strcmp(pname, part->name) != 0 || (size_t)bytes != part->bytes)
        return moe_jval_error(&f, "part", err,
                              "part %d is \"%s\" of %lld bytes, this run needs \"%s\" of %zu: a "
                              "checkpoint of another run",
                              i, pname, (long long)bytes, part->name, part->bytes);
    snprintf(path, sizeof path, "%s/rank%d-%s.bin", sub, rank, part->name);
    char *text;
    size_t got;
    if (!moe_file_is_regular(path))
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0, "missing (no such file)");
    if ((st = moe_file_read(path, MOE_READ_OWN_STATE, part->bytes, &text, &got, err))) {
        if (st == MOE_ERR_INPUT) /* over the size: more bytes than the manifest's */
            st = moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0,
                                  "more than %zu bytes, the manifest's: replaced", part->bytes);
        return st;
    }
    if (got != part->bytes) {
        free(text);
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0,
                                "fewer bytes than the manifest's %zu: truncated or replaced",
                                part->bytes);
    }
    memcpy(part->out, text, got);
    free(text);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)fnv1a(part->out, part->bytes));
    if (strcmp(sum, want) != 0)
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0,
                                "checksum %s, the manifest says %s: the file is corrupt", sum,
                                want);
    return MOE_OK;
}

enum moe_status exec_ckpt_load(const char *dir, int step, const struct exec_ckpt_id *id,
                               struct exec_ckpt_part *parts, int nparts, struct moe_error *err)
{
    char sub[MOE_PATH_MAX], path[MOE_PATH_MAX + 96], model[128], schema[64];
    snprintf(sub, sizeof sub, "%s/step-%08d", dir, step);
    snprintf(path, sizeof path, "%s/manifest-rank%d.json", sub, id->rank);
    struct moe_jdoc doc;
    struct moe_jval root, files;
    int version;
    int64_t nparams, s, rank, ranks;
    enum moe_status st = moe_jdoc_load(&doc, path, err);
    if (st != MOE_OK) return st;
    if ((st = moe_jdoc_schema(&doc, schema, sizeof schema, &version, err)) ||
        (st = moe_jdoc_root(&doc, &root, err)))
        goto done;
    if (strcmp(schema, CKPT_SCHEMA) != 0) {
        st = moe_jval_error(&root, "schema", err, "expected \"%s\"", CKPT_SCHEMA);
        goto done;
    }
    if ((st = moe_jval_str(&root, "model", true, NULL, model, sizeof model, err)) ||
        (st = moe_jval_int(&root, "nparams", true, 0, 0, INT64_MAX, &nparams, err)) ||
        (st = moe_jval_int(&root, "step", true, 0, 0, INT32_MAX, &s, err)) ||
        (st = moe_jval_int(&root, "rank", true, 0, 0, 1 << 24, &rank, err)) ||
        (st = moe_jval_int(&root, "ranks", true, 0, 1, 1 << 24, &ranks, err)) ||
        (st = moe_jval_array(&root, "files", true, &files, NULL, err)))
        goto done;
    if (strcmp(model, id->model) != 0 || (size_t)nparams != id->nparams || s != step ||
        rank != id->rank || ranks != id->ranks) {
        st = moe_jval_error(&root, "model", err,
                            "a checkpoint of %s (%lld parameters, step %lld, rank %lld of %lld); "
                            "this run is %s (%zu parameters, rank %d of %d)",
                            model, (long long)nparams, (long long)s, (long long)rank,
                            (long long)ranks, id->model, id->nparams, id->rank, id->ranks);
        goto done;
    }
    if ((int)moe_jval_len(&files) != nparts) {
        st = moe_jval_error(&root, "files", err, "%zu parts, this run saves %d",
                            moe_jval_len(&files), nparts);
        goto done;
    }
    for (int i = 0; i < nparts && st == MOE_OK; i++)
        st = load_part(sub, id->rank, &files, i, &parts[i], err);
done:
    moe_jdoc_free(&doc);
    return st;
}

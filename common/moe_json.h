/*
 * moe_json.h: common/'s JSON and file interface (json.c, file.c): JSON input with file:line:col in
 * every error and strict unpacking into C structs; output written whole or not at all; input
 * files opened safely and never overwritten. Included by moe_common.h, the module's header.
 */
#ifndef MOE_JSON_H
#define MOE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "moe_common.h" /* enum moe_status, struct moe_error (it includes this file last) */

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* JSON                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

#define MOE_JSON_MAX_BYTES (256u << 20) /* larger input files are refused, not loaded */
#define MOE_JPATH_MAX 256

/* A loaded JSON document: the text is kept so that errors about a value can name its line and
 * column. Treat the fields as read-only. */
struct moe_jdoc {
    char file[MOE_PATH_MAX];
    char *text;
    size_t len;
    json_t *root;
};

/* A view of one object or array inside a document, with its path ("moe.experts", "layers[3]"). */
struct moe_jval {
    const struct moe_jdoc *doc;
    json_t *json;
    char path[MOE_JPATH_MAX];
};

/* Load a file (refusing duplicate keys, non-UTF-8, and files over MOE_JSON_MAX_BYTES).
 * Syntax errors come back as MOE_ERR_INPUT at file:line:col. `doc` is untouched on failure. */
enum moe_status moe_jdoc_load(struct moe_jdoc *doc, const char *file, struct moe_error *err);
/* Parse text already in memory; `name` names it in messages. */
enum moe_status moe_jdoc_parse(struct moe_jdoc *doc, const char *name, const char *text, size_t len,
                               struct moe_error *err);
void moe_jdoc_free(struct moe_jdoc *doc);
/* The root, which must be an object. */
enum moe_status moe_jdoc_root(const struct moe_jdoc *doc, struct moe_jval *out,
                              struct moe_error *err);
/* "schema" (string) and "version" (integer >= 1) of the root object. */
enum moe_status moe_jdoc_schema(const struct moe_jdoc *doc, char *schema, size_t cap, int *version,
                                struct moe_error *err);

/* An input error (MOE_ERR_INPUT) about the value at `v` (or its member `key`, when not NULL),
 * reported at that value's line and column in the document. */
enum moe_status moe_jval_error(const struct moe_jval *v, const char *key, struct moe_error *err,
                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Strict unpacking of an object's members. `required`: a missing key is an error; otherwise the
 * default is stored. Wrong types and values outside [min, max] are errors at the value. */
enum moe_status moe_jval_keys(const struct moe_jval *obj, const char *const *allowed,
                              struct moe_error *err);
bool moe_jval_has(const struct moe_jval *obj, const char *key);
/* The member exists and is JSON null (Hugging Face configs write null for "not used"). */
bool moe_jval_is_null(const struct moe_jval *obj, const char *key);
enum moe_status moe_jval_int(const struct moe_jval *obj, const char *key, bool required,
                             int64_t def, int64_t min, int64_t max, int64_t *out,
                             struct moe_error *err);
/* The same into an int (min and max within int range). */
enum moe_status moe_jval_int32(const struct moe_jval *obj, const char *key, bool required, int def,
                               int min, int max, int *out, struct moe_error *err);
enum moe_status moe_jval_num(const struct moe_jval *obj, const char *key, bool required, double def,
                             double min, double max, double *out, struct moe_error *err);
enum moe_status moe_jval_bool(const struct moe_jval *obj, const char *key, bool required, bool def,
                              bool *out, struct moe_error *err);
enum moe_status moe_jval_str(const struct moe_jval *obj, const char *key, bool required,
                             const char *def, char *buf, size_t cap, struct moe_error *err);
/* A size ("141GB", "64K", or a plain number) or a bandwidth ("400Gbps", "450GB/s", or a number of
 * bytes per second), parsed by the unit rules above; must be in [min, max]. */
enum moe_status moe_jval_size(const struct moe_jval *obj, const char *key, bool required,
                              double def, double min, double max, double *out,
                              struct moe_error *err);
enum moe_status moe_jval_bandwidth(const struct moe_jval *obj, const char *key, bool required,
                                   double def, double min, double max, double *out,
                                   struct moe_error *err);
/* A string that must be one of `names` (NULL-terminated); stores its index. */
enum moe_status moe_jval_enum(const struct moe_jval *obj, const char *key, bool required, int def,
                              const char *const *names, int *out, struct moe_error *err);
/* A member that is an object (or an array). `present` (may be NULL) says whether it exists;
 * a missing optional member leaves `out` untouched. */
enum moe_status moe_jval_object(const struct moe_jval *obj, const char *key, bool required,
                                struct moe_jval *out, bool *present, struct moe_error *err);
enum moe_status moe_jval_array(const struct moe_jval *obj, const char *key, bool required,
                               struct moe_jval *out, bool *present, struct moe_error *err);
size_t moe_jval_len(const struct moe_jval *arr);
/* Element i of an array, which must be an object / an array / a number in range. */
enum moe_status moe_jval_at_object(const struct moe_jval *arr, size_t i, struct moe_jval *out,
                                   struct moe_error *err);
enum moe_status moe_jval_at_array(const struct moe_jval *arr, size_t i, struct moe_jval *out,
                                  struct moe_error *err);
enum moe_status moe_jval_at_num(const struct moe_jval *arr, size_t i, double min, double max,
                                double *out, struct moe_error *err);
enum moe_status moe_jval_at_int(const struct moe_jval *arr, size_t i, int64_t min, int64_t max,
                                int64_t *out, struct moe_error *err);

/* Find the line and column (1-based) of the value at `jpath` ("a.b[2].c") in JSON text.
 * Returns false when the path is not found; then *line and *col are left unchanged. */
bool moe_json_locate(const char *text, size_t len, const char *jpath, int *line, int *col);

/* Write `root` to `file` through moe_file_write_atomic. "schema" and "version" are set first in
 * the written object. */
enum moe_status moe_json_write_atomic(const char *file, json_t *root, const char *schema,
                                      int version, struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Files (file.c)                                                                                 */
/* ---------------------------------------------------------------------------------------------- */

/* Open a user's input file for reading: stat first and open non-blocking, so that a FIFO, a
 * device or a folder is refused at once (MOE_ERR_INPUT, "not a regular file") and never blocks.
 * The file is remembered as an input of this process: moe_file_write_atomic refuses to replace
 * it. */
enum moe_status moe_file_open_input(const char *path, FILE **out, struct moe_error *err);
/* The whole of a file (moe_file_open_input's checks), at most `max_bytes` (a larger one is
 * refused, not read), NUL-terminated in *text (free it; the file's own NULs stay in it). An
 * input is remembered as moe_file_open_input's are; a file of moeplan's own state that a run
 * writes again (a checkpoint's) is not. */
enum moe_read { MOE_READ_INPUT, MOE_READ_OWN_STATE };
enum moe_status moe_file_read(const char *path, enum moe_read kind, size_t max_bytes, char **text,
                              size_t *len, struct moe_error *err);
/* The path names a regular file (following links); never blocks. */
bool moe_file_is_regular(const char *path);
/* Whether `file` may be written as an output (MOE_ERR_USAGE, exit 2, and why, if not): "-"
 * (standard output), or a regular file or none yet in an existing folder, reached through any
 * chain of symbolic links, that this process did not read as an input. A device, a FIFO, a
 * socket, a folder and a loop of links are refused. The CLI calls it for every output option as
 * it parses the command line; moe_file_write_atomic calls it again. */
enum moe_status moe_output_check(const char *file, struct moe_error *err);
/* The same for an output folder: an existing folder (through links), or a new one whose parent
 * exists; "-" is refused. moe_output_dir_make also makes it (one level). */
enum moe_status moe_output_dir_check(const char *dir, struct moe_error *err);
enum moe_status moe_output_dir_make(const char *dir, struct moe_error *err);
/* A "-" output takes standard output for its data: from here on, whatever else the process
 * prints to standard output goes to standard error. One claim a process (a second is refused). */
enum moe_status moe_stdout_claim(struct moe_error *err);
/* Give standard output back as it was before the claim (before exec'ing a program that claims it
 * again). */
void moe_stdout_release(void);
/* Write bytes to `file` (moe_output_check's rules): "-" is standard output; a symbolic link is
 * written through (the link stays); a regular file is replaced atomically (a temp file in the
 * same folder, fsync, rename, fsync of the folder) with SIGINT, SIGTERM, SIGHUP and SIGPIPE held
 * until the temp file is renamed or removed. A failure leaves any previous file as it was and no
 * temp file. */
enum moe_status moe_file_write_atomic(const char *file, const void *data, size_t len,
                                      struct moe_error *err);

/* The jansson version this binary runs with. */
const char *moe_jansson_version(void);

#ifdef __cplusplus
}
#endif

#endif /* MOE_JSON_H */

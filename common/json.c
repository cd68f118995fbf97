/*
 * json.c: JSON input with positions, strict unpacking, and atomic output, over jansson.
 *
 * Input: a document keeps its text next to the parsed tree. jansson reports line and column for
 * syntax errors only; for a semantic error ("moe.experts must be >= 1") we find the value's place
 * again by scanning the text along the value's path (moe_json_locate), so every input error names
 * file:line:col. Unpacking is strict: unknown keys, wrong types and values out of range are errors,
 * never silently ignored or clamped.
 *
 * Output: every file is written to a temp file in the same folder, fsynced, then renamed over the
 * target, and the folder is fsynced: a crash at any moment leaves the old file or the new one.
 */
#include "moe_common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* Loading                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

enum moe_status moe_jdoc_parse(struct moe_jdoc *doc, const char *name, const char *text, size_t len,
                               struct moe_error *err)
{
    if (len > MOE_JSON_MAX_BYTES)
        return moe_error_set_at(err, MOE_ERR_INPUT, name, 0, 0,
                                "file is %zu bytes, more than the %u-byte limit for JSON input",
                                len, MOE_JSON_MAX_BYTES);
    if (memchr(text, '\0', len))
        return moe_error_set_at(err, MOE_ERR_INPUT, name, 0, 0,
                                "file contains a NUL byte: not a JSON text");
    /* A UTF-8 byte-order mark (Windows editors write one): RFC 8259 lets a parser ignore it, and
     * jansson would otherwise report an invisible character. */
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) {
        text += 3;
        len -= 3;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        int line = jerr.line > 0 ? jerr.line : 1, col = jerr.column > 0 ? jerr.column : 1;
        return moe_error_set_at(err, MOE_ERR_INPUT, name, line, col, "%s", jerr.text);
    }
    char *copy = malloc(len + 1);
    if (!copy) {
        json_decref(root);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory loading %s", name);
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    snprintf(doc->file, sizeof doc->file, "%s", name);
    doc->text = copy;
    doc->len = len;
    doc->root = root;
    return MOE_OK;
}

enum moe_status moe_jdoc_load(struct moe_jdoc *doc, const char *file, struct moe_error *err)
{
    char *buf;
    size_t len;
    enum moe_status st = moe_file_read(file, MOE_READ_INPUT, MOE_JSON_MAX_BYTES, &buf, &len, err);
    if (st != MOE_OK) return st;
    st = moe_jdoc_parse(doc, file, buf, len, err);
    free(buf);
    return st;
}

void moe_jdoc_free(struct moe_jdoc *doc)
{
    if (!doc) return;
    json_decref(doc->root);
    free(doc->text);
    memset(doc, 0, sizeof *doc);
}

enum moe_status moe_jdoc_root(const struct moe_jdoc *doc, struct moe_jval *out,
                              struct moe_error *err)
{
    if (!json_is_object(doc->root))
        return moe_error_set_at(err, MOE_ERR_INPUT, doc->file, 1, 1,
                                "the top level must be a JSON object");
    out->doc = doc;
    out->json = doc->root;
    out->path[0] = '\0';
    return MOE_OK;
}

enum moe_status moe_jdoc_schema(const struct moe_jdoc *doc, char *schema, size_t cap, int *version,
                                struct moe_error *err)
{
    struct moe_jval root;
    enum moe_status st = moe_jdoc_root(doc, &root, err);
    if (st != MOE_OK) return st;
    char s[128];
    int64_t v;
    if ((st = moe_jval_str(&root, "schema", true, NULL, s, sizeof s, err)) != MOE_OK) return st;
    if ((st = moe_jval_int(&root, "version", true, 0, 1, 1000000, &v, err)) != MOE_OK) return st;
    snprintf(schema, cap, "%s", s);
    *version = (int)v;
    return MOE_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Locating a value in the text                                                                   */
/* ---------------------------------------------------------------------------------------------- */

/* A cursor over JSON text that tracks line and column (columns count characters, not bytes). */
struct cursor {
    const char *p, *end;
    int line, col;
};

static void cur_step(struct cursor *c)
{
    if (c->p >= c->end) return;
    unsigned char ch = (unsigned char)*c->p++;
    if (ch == '\n') {
        c->line++;
        c->col = 1;
    } else if ((ch & 0xC0) != 0x80) {
        c->col++;
    }
}

static void cur_ws(struct cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        cur_step(c);
}

/* Skip a string starting at '"'; if `key` is not NULL, say whether its raw content equals key. */
static bool cur_string(struct cursor *c, const char *key, size_t key_len)
{
    cur_step(c); /* opening quote */
    const char *start = c->p;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\') cur_step(c);
        cur_step(c);
    }
    bool match = key && (size_t)(c->p - start) == key_len && memcmp(start, key, key_len) == 0;
    cur_step(c); /* closing quote */
    return match;
}

/* Skip one value (the text is valid JSON: jansson parsed it). */
static void cur_skip_value(struct cursor *c)
{
    cur_ws(c);
    if (c->p >= c->end) return;
    if (*c->p == '"') {
        cur_string(c, NULL, 0);
        return;
    }
    if (*c->p == '{' || *c->p == '[') {
        int depth = 0;
        do {
            if (*c->p == '"') {
                cur_string(c, NULL, 0);
                continue;
            }
            if (*c->p == '{' || *c->p == '[')
                depth++;
            else if (*c->p == '}' || *c->p == ']')
                depth--;
            cur_step(c);
        } while (depth > 0 && c->p < c->end);
        return;
    }
    while (c->p < c->end && !strchr(",]} \t\r\n", *c->p)) cur_step(c);
}

/* Move to the value of member `key` of the object at the cursor. */
static bool cur_member(struct cursor *c, const char *key, size_t key_len)
{
    cur_ws(c);
    if (c->p >= c->end || *c->p != '{') return false;
    cur_step(c);
    for (;;) {
        cur_ws(c);
        if (c->p >= c->end || *c->p != '"') return false;
        bool match = cur_string(c, key, key_len);
        cur_ws(c);
        if (c->p >= c->end || *c->p != ':') return false;
        cur_step(c);
        cur_ws(c);
        if (match) return true;
        cur_skip_value(c);
        cur_ws(c);
        if (c->p >= c->end || *c->p != ',') return false;
        cur_step(c);
    }
}

/* Move to element `index` of the array at the cursor. */
static bool cur_element(struct cursor *c, long index)
{
    cur_ws(c);
    if (c->p >= c->end || *c->p != '[') return false;
    cur_step(c);
    for (long i = 0;; i++) {
        cur_ws(c);
        if (c->p >= c->end || *c->p == ']') return false;
        if (i == index) return true;
        cur_skip_value(c);
        cur_ws(c);
        if (c->p >= c->end || *c->p != ',') return false;
        cur_step(c);
    }
}

bool moe_json_locate(const char *text, size_t len, const char *jpath, int *line, int *col)
{
    struct cursor c = {text, text + len, 1, 1};
    const char *s = jpath ? jpath : "";
    while (*s) {
        if (*s == '.') {
            s++;
            continue;
        }
        if (*s == '[') {
            char *e;
            long idx = strtol(s + 1, &e, 10);
            if (*e != ']' || idx < 0) return false;
            if (!cur_element(&c, idx)) return false;
            s = e + 1;
            continue;
        }
        size_t n = strcspn(s, ".[");
        if (!cur_member(&c, s, n)) return false;
        s += n;
    }
    cur_ws(&c);
    *line = c.line;
    *col = c.col;
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* Strict unpacking                                                                               */
/* ---------------------------------------------------------------------------------------------- */

/* A path is cut at the buffer's size; that only shortens messages, never changes a lookup of a
 * path that fits (MOE_JPATH_MAX is far beyond any schema's depth). */
static void path_join(char *out, size_t cap, const char *base, const char *key)
{
    int n;
    if (!key)
        n = snprintf(out, cap, "%s", base);
    else if (base[0])
        n = snprintf(out, cap, "%s.%s", base, key);
    else
        n = snprintf(out, cap, "%s", key);
    if (n < 0 || (size_t)n >= cap) out[cap - 1] = '\0';
}

enum moe_status moe_jval_error(const struct moe_jval *v, const char *key, struct moe_error *err,
                               const char *fmt, ...)
{
    if (!err) return MOE_ERR_INPUT;
    char path[MOE_JPATH_MAX + 64];
    /* Point at the member when it exists, else at the object that lacks it. */
    bool member = key && json_is_object(v->json) && json_object_get(v->json, key);
    path_join(path, sizeof path, v->path, member ? key : NULL);
    int line = 1, col = 1;
    moe_json_locate(v->doc->text, v->doc->len, path, &line, &col);
    char msg[MOE_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char shown[MOE_JPATH_MAX + 64];
    path_join(shown, sizeof shown, v->path, key);
    if (shown[0])
        return moe_error_set_at(err, MOE_ERR_INPUT, v->doc->file, line, col, "%s: %s", shown, msg);
    return moe_error_set_at(err, MOE_ERR_INPUT, v->doc->file, line, col, "%s", msg);
}

static const char *json_type_name(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

/* The member `key`, or NULL (with the error filled when it is required). */
static enum moe_status member_get(const struct moe_jval *obj, const char *key, bool required,
                                  json_t **out, struct moe_error *err)
{
    json_t *j = json_object_get(obj->json, key);
    *out = NULL;
    if (!j && required) return moe_jval_error(obj, key, err, "required key is missing");
    *out = j;
    return MOE_OK;
}

bool moe_jval_has(const struct moe_jval *obj, const char *key)
{
    return json_object_get(obj->json, key) != NULL;
}

bool moe_jval_is_null(const struct moe_jval *obj, const char *key)
{
    return json_is_null(json_object_get(obj->json, key));
}

enum moe_status moe_jval_keys(const struct moe_jval *obj, const char *const *allowed,
                              struct moe_error *err)
{
    const char *key;
    json_t *value;
    json_object_foreach(obj->json, key, value)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0) ok = true;
        if (!ok) {
            char list[512] = "";
            size_t used = 0;
            for (const char *const *a = allowed; *a && used < sizeof list - 8; a++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                         a == allowed ? "" : ", ", *a);
            return moe_jval_error(obj, key, err, "unknown key (allowed: %s)", list);
        }
    }
    return MOE_OK;
}

enum moe_status moe_jval_int(const struct moe_jval *obj, const char *key, bool required,
                             int64_t def, int64_t min, int64_t max, int64_t *out,
                             struct moe_error *err)
{
    json_t *j = NULL;
    enum moe_status st = member_get(obj, key, required, &j, err);
    if (st != MOE_OK) return st;
    if (!j) {
        *out = def;
        return MOE_OK;
    }
    if (!json_is_integer(j))
        return moe_jval_error(obj, key, err, "must be an integer, not %s", json_type_name(j));
    int64_t v = (int64_t)json_integer_value(j);
    if (v < min || v > max)
        return moe_jval_error(obj, key, err, "must be in [%" PRId64 ", %" PRId64 "], got %" PRId64,
                              min, max, v);
    *out = v;
    return MOE_OK;
}

enum moe_status moe_jval_int32(const struct moe_jval *obj, const char *key, bool required, int def,
                               int min, int max, int *out, struct moe_error *err)
{
    int64_t v;
    enum moe_status st = moe_jval_int(obj, key, required, def, min, max, &v, err);
    if (st == MOE_OK) *out = (int)v;
    return st;
}

enum moe_status moe_jval_num(const struct moe_jval *obj, const char *key, bool required, double def,
                             double min, double max, double *out, struct moe_error *err)
{
    json_t *j = NULL;
    enum moe_status st = member_get(obj, key, required, &j, err);
    if (st != MOE_OK) return st;
    if (!j) {
        *out = def;
        return MOE_OK;
    }
    if (!json_is_number(j))
        return moe_jval_error(obj, key, err, "must be a number, not %s", json_type_name(j));
    double v = json_number_value(j);
    if (!isfinite(v) || v < min || v > max)
        return moe_jval_error(obj, key, err, "must be in [%g, %g], got %g", min, max, v);
    *out = v;
    return MOE_OK;
}

enum moe_status moe_jval_bool(const struct moe_jval *obj, const char *key, bool required, bool def,
                              bool *out, struct moe_error *err)
{
    json_t *j = NULL;
    enum moe_status st = member_get(obj, key, required, &j, err);
    if (st != MOE_OK) return st;
    if (!j) {
        *out = def;
        return MOE_OK;
    }
    if (!json_is_boolean(j))
        return moe_jval_error(obj, key, err, "must be true or false, not %s", json_type_name(j));
    *out = json_is_true(j);
    return MOE_OK;
}

enum moe_status moe_jval_str(const struct moe_jval *obj, const char *key, bool required,
                             const char *def, char *buf, size_t cap, struct moe_error *err)
{
    json_t *j = NULL;
    enum moe_status st = member_get(obj, key, required, &j, err);
    if (st != MOE_OK) return st;
    if (!j) {
        snprintf(buf, cap, "%s", def ? def : "");
        return MOE_OK;
    }
    if (!json_is_string(j))
        return moe_jval_error(obj, key, err, "must be a string, not %s", json_type_name(j));
    size_t n = json_string_length(j);
    if (n + 1 > cap)
        return moe_jval_error(obj, key, err, "string is too long (%zu bytes, at most %zu)", n,
                              cap - 1);
    const unsigned char *v = (const unsigned char *)json_string_value(j);
    for (size_t i = 0; i < n; i++)
        /* names and paths end up on terminals: no escape sequences, tabs or line breaks */
        if (v[i] < 0x20 || v[i] == 0x7f)
            return moe_jval_error(
                obj, key, err, "string contains a control character (0x%02x at byte %zu)", v[i], i);
    memcpy(buf, v, n + 1);
    return MOE_OK;
}

/* A number, or a string with units parsed by `parse`. */
static enum moe_status member_units(const struct moe_jval *obj, const char *key, bool required,
                                    double def, double min, double max, double *out,
                                    enum moe_status (*parse)(const char *, double *,
                                                             struct moe_error *),
                                    struct moe_error *err)
{
    json_t *j = NULL;
    enum moe_status st = member_get(obj, key, required, &j, err);
    if (st != MOE_OK) return st;
    double v = def;
    if (j && json_is_number(j)) {
        v = json_number_value(j);
    } else if (j && json_is_string(j)) {
        struct moe_error perr;
        if (parse(json_string_value(j), &v, &perr) != MOE_OK)
            return moe_jval_error(obj, key, err, "%s", perr.message);
    } else if (j) {
        return moe_jval_error(obj, key, err, "must be a number or a string with units, not %s",
                              json_type_name(j));
    }
    if (j && (!isfinite(v) || v < min || v > max))
        return moe_jval_error(obj, key, err, "must be in [%g, %g], got %g", min, max, v);
    *out = v;
    return MOE_OK;
}

enum moe_status moe_jval_size(const struct moe_jval *obj, const char *key, bool required,
                              double def, double min, double max, double *out,
                              struct moe_error *err)
{
    return member_units(obj, key, required, def, min, max, out, moe_parse_size, err);
}

enum moe_status moe_jval_bandwidth(const struct moe_jval *obj, const char *key, bool required,
                                   double def, double min, double max, double *out,
                                   struct moe_error *err)
{
    return member_units(obj, key, required, def, min, max, out, moe_parse_bandwidth, err);
}

enum moe_status moe_jval_enum(const struct moe_jval *obj, const char *key, bool required, int def,
                              const char *const *names, int *out, struct moe_error *err)
{
    char s[128];
    enum moe_status st = moe_jval_str(obj, key, required, NULL, s, sizeof s, err);
    if (st != MOE_OK) return st;
    if (!moe_jval_has(obj, key)) {
        *out = def;
        return MOE_OK;
    }
    char list[512] = "";
    size_t used = 0;
    for (int i = 0; names[i]; i++) {
        if (strcmp(names[i], s) == 0) {
            *out = i;
            return MOE_OK;
        }
        if (used < sizeof list - 8)
            used +=
                (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    }
    return moe_jval_error(obj, key, err, "'%s' is not one of: %s", s, list);
}

static enum moe_status member_container(const struct moe_jval *obj, const char *key, bool required,
                                        bool want_array, struct moe_jval *out, bool *present,
                                        struct moe_error *err)
{
    json_t *j = NULL;
    enum moe_status st = member_get(obj, key, required, &j, err);
    if (st != MOE_OK) return st;
    if (present) *present = j != NULL;
    if (!j) return MOE_OK;
    if (want_array ? !json_is_array(j) : !json_is_object(j))
        return moe_jval_error(obj, key, err, "must be %s, not %s",
                              want_array ? "an array" : "an object", json_type_name(j));
    out->doc = obj->doc;
    out->json = j;
    path_join(out->path, sizeof out->path, obj->path, key);
    return MOE_OK;
}

enum moe_status moe_jval_object(const struct moe_jval *obj, const char *key, bool required,
                                struct moe_jval *out, bool *present, struct moe_error *err)
{
    return member_container(obj, key, required, false, out, present, err);
}

enum moe_status moe_jval_array(const struct moe_jval *obj, const char *key, bool required,
                               struct moe_jval *out, bool *present, struct moe_error *err)
{
    return member_container(obj, key, required, true, out, present, err);
}

size_t moe_jval_len(const struct moe_jval *arr)
{
    return json_array_size(arr->json);
}

/* Element i as a view, for errors about it. */
static void element_view(const struct moe_jval *arr, size_t i, struct moe_jval *out)
{
    out->doc = arr->doc;
    out->json = json_array_get(arr->json, i);
    int n = snprintf(out->path, sizeof out->path, "%s[%zu]", arr->path, i);
    if (n < 0 || (size_t)n >= sizeof out->path) out->path[sizeof out->path - 1] = '\0';
}

/* Element i, which must be of JSON type `type` (`what` names it in the error). */
static enum moe_status element_of(const struct moe_jval *arr, size_t i, json_type type,
                                  const char *what, struct moe_jval *out, struct moe_error *err)
{
    struct moe_jval e;
    element_view(arr, i, &e);
    if (!e.json || json_typeof(e.json) != type)
        return moe_jval_error(&e, NULL, err, "must be %s, not %s", what,
                              e.json ? json_type_name(e.json) : "missing");
    *out = e;
    return MOE_OK;
}

enum moe_status moe_jval_at_object(const struct moe_jval *arr, size_t i, struct moe_jval *out,
                                   struct moe_error *err)
{
    return element_of(arr, i, JSON_OBJECT, "an object", out, err);
}

enum moe_status moe_jval_at_array(const struct moe_jval *arr, size_t i, struct moe_jval *out,
                                  struct moe_error *err)
{
    return element_of(arr, i, JSON_ARRAY, "a list", out, err);
}

enum moe_status moe_jval_at_num(const struct moe_jval *arr, size_t i, double min, double max,
                                double *out, struct moe_error *err)
{
    struct moe_jval e;
    element_view(arr, i, &e);
    if (!json_is_number(e.json))
        return moe_jval_error(&e, NULL, err, "must be a number, not %s",
                              e.json ? json_type_name(e.json) : "missing");
    double v = json_number_value(e.json);
    if (!isfinite(v) || v < min || v > max)
        return moe_jval_error(&e, NULL, err, "must be in [%g, %g], got %g", min, max, v);
    *out = v;
    return MOE_OK;
}

enum moe_status moe_jval_at_int(const struct moe_jval *arr, size_t i, int64_t min, int64_t max,
                                int64_t *out, struct moe_error *err)
{
    struct moe_jval e;
    element_view(arr, i, &e);
    if (!json_is_integer(e.json))
        return moe_jval_error(&e, NULL, err, "must be an integer, not %s",
                              e.json ? json_type_name(e.json) : "missing");
    int64_t v = (int64_t)json_integer_value(e.json);
    if (v < min || v > max)
        return moe_jval_error(&e, NULL, err, "must be in [%" PRId64 ", %" PRId64 "], got %" PRId64,
                              min, max, v);
    *out = v;
    return MOE_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Output (written through moe_file_write_atomic, file.c)                                         */
/* ---------------------------------------------------------------------------------------------- */

enum moe_status moe_json_write_atomic(const char *file, json_t *root, const char *schema,
                                      int version, struct moe_error *err)
{
    if (!json_is_object(root))
        return moe_error_set(err, MOE_ERR_RUNTIME, "%s: output is not a JSON object", file);
    json_t *out = json_object();
    if (!out) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory writing %s", file);
    json_object_set_new(out, "schema", json_string(schema));
    json_object_set_new(out, "version", json_integer(version));
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "schema") != 0 && strcmp(key, "version") != 0)
            json_object_set(out, key, value);
    }
    char *text = json_dumps(out, JSON_INDENT(2) | JSON_REAL_PRECISION(12) | JSON_ENSURE_ASCII);
    json_decref(out);
    if (!text) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory writing %s", file);
    size_t n = strlen(text);
    char *with_nl = realloc(text, n + 2);
    if (!with_nl) {
        free(text);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory writing %s", file);
    }
    with_nl[n] = '\n';
    with_nl[n + 1] = '\0';
    enum moe_status st = moe_file_write_atomic(file, with_nl, n + 1, err);
    free(with_nl);
    return st;
}

const char *moe_jansson_version(void)
{
    return jansson_version_str();
}

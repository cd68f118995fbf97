/*
 * file.c: opening the user's input files and writing our output files, safely.
 *
 * Input: a path is looked at with stat() before it is opened, and opened non-blocking, so a FIFO,
 * a device or a folder given as an input file is refused at once ("not a regular file") instead
 * of blocking forever on open() or read(). Every input file opened through moe_file_open_input is
 * remembered (device and inode) for the life of the process.
 *
 * Output: moe_file_write_atomic is the one way moeplan writes a file. It refuses to replace a
 * file this process read as an input (`plan -o model.json --model model.json` would otherwise
 * destroy the model), writes through a symbolic link to its target (the link stays), streams into
 * an existing character device or FIFO (`-o /dev/null`) instead of replacing it with a regular
 * file, and takes "-" as standard output. A regular file is written to a temp file in the target's
 * folder, fsynced and renamed over the target; SIGINT, SIGTERM and SIGHUP are held back while the
 * temp file exists, so an interrupted write never leaves a `*.tmp.*` file behind (the signal takes
 * effect right after the rename or the clean-up).
 *
 * Why a process-wide list of inputs, against the rule of no mutable globals: the files a command
 * reads are found deep inside the loaders (a node XML named by a cluster, the GPU specs beside a
 * cluster file), and the guarantee "no command changes an input's bytes" must hold for all of
 * them, whatever option names the output. The list only grows, is guarded by a mutex, and holds
 * no state that changes a result. A file is known by device, inode and change time: an inode
 * number freed by a deleted input may name a new file later.
 */
#include "moe_common.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* The inputs this process read                                                                   */
/* ---------------------------------------------------------------------------------------------- */

struct input {
    dev_t dev;
    ino_t ino;
    struct timespec ctime; /* an inode number is reused once its file is deleted */
    char path[MOE_PATH_MAX];
};

static struct {
    pthread_mutex_t lock;
    int n, cap;
    struct input *at; /* grows; freed by the process's exit */
} inputs = {PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL};

static bool same_file(const struct input *in, const struct stat *sb)
{
    return in->dev == sb->st_dev && in->ino == sb->st_ino &&
           in->ctime.tv_sec == sb->st_ctim.tv_sec && in->ctime.tv_nsec == sb->st_ctim.tv_nsec;
}

/* Remember an input; false when out of memory (the caller refuses the file then: an input that
 * could not be remembered could be overwritten). */
static bool input_remember(const struct stat *sb, const char *path)
{
    bool ok = true;
    pthread_mutex_lock(&inputs.lock);
    bool known = false;
    for (int i = 0; i < inputs.n && !known; i++) {
        struct input *in = &inputs.at[i];
        known = same_file(in, sb);
        if (!known && !strcmp(in->path, path)) {
            /* the same name read again names a new file now (a loop rewriting one path, as the
             * fuzzers do): the entry follows the name, so the list stays as long as the names */
            in->dev = sb->st_dev;
            in->ino = sb->st_ino;
            in->ctime = sb->st_ctim;
            known = true;
        }
    }
    if (!known && inputs.n == inputs.cap) {
        int cap = inputs.cap ? 2 * inputs.cap : 16;
        struct input *at = realloc(inputs.at, sizeof *at * (size_t)cap);
        if (at) {
            inputs.at = at;
            inputs.cap = cap;
        } else {
            ok = false;
        }
    }
    if (!known && ok) {
        struct input *in = &inputs.at[inputs.n++];
        in->dev = sb->st_dev;
        in->ino = sb->st_ino;
        in->ctime = sb->st_ctim;
        snprintf(in->path, sizeof in->path, "%s", path);
    }
    pthread_mutex_unlock(&inputs.lock);
    return ok;
}

/* The path under which `sb` was read as an input, or NULL. */
static const char *input_find(const struct stat *sb, char *buf, size_t cap)
{
    const char *found = NULL;
    pthread_mutex_lock(&inputs.lock);
    for (int i = 0; i < inputs.n && !found; i++)
        if (same_file(&inputs.at[i], sb)) {
            snprintf(buf, cap, "%s", inputs.at[i].path);
            found = buf;
        }
    pthread_mutex_unlock(&inputs.lock);
    return found;
}

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a folder"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

enum moe_status moe_file_open_input(const char *path, FILE **out, struct moe_error *err)
{
    if (!path || !path[0]) return moe_error_set(err, MOE_ERR_INPUT, "an empty file name");
    if (strlen(path) >= MOE_PATH_MAX)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "a path of %zu characters, more than the %d allowed", strlen(path),
                             MOE_PATH_MAX - 1);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0, "cannot open: %s", strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0, "not a regular file (%s)",
                                file_kind(sb.st_mode));
    /* Non-blocking: the path may have become a FIFO since the stat. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0, "cannot open: %s", strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0, "not a regular file");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory opening %s", path);
    }
    if (!input_remember(&sb, path)) {
        fclose(f);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory opening %s", path);
    }
    *out = f;
    return MOE_OK;
}

bool moe_file_is_regular(const char *path)
{
    struct stat sb;
    return path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---------------------------------------------------------------------------------------------- */
/* Output                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* Where an output path really writes: the path itself, or a symbolic link's final target. */
static enum moe_status output_target(const char *file, char *target, size_t cap, struct stat *sb,
                                     bool *exists, struct moe_error *err)
{
    if (!file || !file[0]) return moe_error_set(err, MOE_ERR_USAGE, "an empty output file name");
    if (strlen(file) >= MOE_PATH_MAX - 16)
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output path has %zu characters, more than "
                             "the %d allowed",
                             strlen(file), MOE_PATH_MAX - 17);
    snprintf(target, cap, "%s", file);
    struct stat lsb;
    *exists = lstat(file, &lsb) == 0;
    if (*exists && S_ISLNK(lsb.st_mode)) {
        char resolved[PATH_MAX];
        if (!realpath(file, resolved)) {
            /* A dangling link: its target does not exist yet; write where it points. */
            char link[MOE_PATH_MAX];
            ssize_t n = readlink(file, link, sizeof link - 1);
            if (n <= 0)
                return moe_error_set_at(err, MOE_ERR_IO, file, 0, 0, "cannot read the link: %s",
                                        strerror(errno));
            link[n] = '\0';
            if (link[0] == '/') {
                snprintf(target, cap, "%s", link);
            } else {
                char dir[MOE_PATH_MAX];
                snprintf(dir, sizeof dir, "%s", file);
                if ((size_t)snprintf(target, cap, "%s/%s", dirname(dir), link) >= cap)
                    return moe_error_set(err, MOE_ERR_USAGE,
                                         "%s: the link's target path is too "
                                         "long",
                                         file);
            }
            *exists = false;
            return MOE_OK;
        }
        if (strlen(resolved) >= cap - 16)
            return moe_error_set(err, MOE_ERR_USAGE, "%s: the link's target path is too long",
                                 file);
        snprintf(target, cap, "%s", resolved);
    }
    if (*exists && stat(target, sb) != 0) *exists = false;
    return MOE_OK;
}

/* The output's real target (a link's), checked: not an input of this process, not a folder or
 * another non-file. `exists` and `sb` describe the target. */
static enum moe_status output_resolve(const char *file, char *target, size_t cap, struct stat *sb,
                                      bool *exists, struct moe_error *err)
{
    char input[MOE_PATH_MAX];
    *exists = false;
    enum moe_status st = output_target(file, target, cap, sb, exists, err);
    if (st != MOE_OK || !*exists) return st;
    if (input_find(sb, input, sizeof input)) {
        if (!strcmp(input, file))
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "the output %s is an input of this command: moeplan never "
                                 "overwrites its inputs; write the output elsewhere",
                                 file);
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output %s is %s, an input of this command: moeplan never "
                             "overwrites its inputs; write the output elsewhere",
                             file, input);
    }
    if (S_ISREG(sb->st_mode) || S_ISCHR(sb->st_mode) || S_ISFIFO(sb->st_mode)) return MOE_OK;
    return moe_error_set(err, MOE_ERR_USAGE, "the output %s is %s, not a file", file,
                         file_kind(sb->st_mode));
}

enum moe_status moe_output_check(const char *file, struct moe_error *err)
{
    if (file && strcmp(file, "-") == 0) return MOE_OK;
    char target[MOE_PATH_MAX];
    struct stat sb;
    bool exists;
    return output_resolve(file, target, sizeof target, &sb, &exists, err);
}

static enum moe_status write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return MOE_ERR_IO;
        p += n;
        len -= (size_t)n;
    }
    return MOE_OK;
}

/* Standard output, a character device or a FIFO: written in place, no temp file. */
static enum moe_status write_stream(const char *file, const char *target, const void *data,
                                    size_t len, struct moe_error *err)
{
    int fd = 1;
    if (strcmp(file, "-") == 0) {
        fflush(stdout);
    } else {
        fd = open(target, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0)
            return moe_error_set_at(err, MOE_ERR_IO, file, 0, 0, "cannot write: %s%s",
                                    strerror(errno),
                                    errno == ENXIO ? " (a FIFO with no reader)" : "");
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    }
    enum moe_status st = write_all(fd, data, len);
    int saved = errno;
    if (fd != 1) close(fd);
    if (st != MOE_OK)
        return moe_error_set_at(err, MOE_ERR_IO, file, 0, 0, "write failed: %s", strerror(saved));
    return MOE_OK;
}

static void fsync_parent(const char *file)
{
    char dir[MOE_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", file);
    int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd); /* best effort: some file systems refuse fsync of a folder */
        close(fd);
    }
}

enum moe_status moe_file_write_atomic(const char *file, const void *data, size_t len,
                                      struct moe_error *err)
{
    if (file && strcmp(file, "-") == 0) return write_stream(file, file, data, len, err);
    char target[MOE_PATH_MAX];
    struct stat sb;
    bool exists = false;
    enum moe_status st = output_resolve(file, target, sizeof target, &sb, &exists, err);
    if (st != MOE_OK) return st;
    if (exists && (S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode)))
        return write_stream(file, target, data, len, err);

    char tmp[MOE_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", target);
    /* Hold the terminating signals while the temp file exists: they land after the rename or
     * the unlink, so no temp file outlives the process (SIGKILL aside). */
    sigset_t hold, old;
    sigemptyset(&hold);
    sigaddset(&hold, SIGINT);
    sigaddset(&hold, SIGTERM);
    sigaddset(&hold, SIGHUP);
    sigaddset(&hold, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &hold, &old);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int saved = errno;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return moe_error_set_at(err, MOE_ERR_IO, file, 0, 0, "cannot create a temp file: %s",
                                strerror(saved));
    }
    if (write_all(fd, data, len) != MOE_OK) goto fail;
    if (fsync(fd) != 0) goto fail;
    /* mkstemp makes the file 0600; written files should be as readable as any other output. */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0) goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, target) != 0) goto fail;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    fsync_parent(target);
    return MOE_OK;
fail:;
    int saved = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return moe_error_set_at(err, MOE_ERR_IO, file, 0, 0, "write failed: %s", strerror(saved));
}

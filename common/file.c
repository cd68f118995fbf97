/*
 * file.c: the one way moeplan reads the user's files and writes its own.
 *
 * Input: moe_file_open_input looks at a path with stat() before opening it, and opens it
 * non-blocking, so a FIFO, a device or a folder given as an input is refused at once ("not a
 * regular file") instead of blocking forever. moe_file_read loads a whole input under a size
 * limit. Every input opened here is remembered (device, inode, change time) for the life of the
 * process.
 *
 * Output: every option that names an output goes through moe_output_check (a file) or
 * moe_output_dir_check (a folder) when the command line is parsed, and every byte is written by
 * moe_file_write_atomic. The rules:
 *   - regular files only: a device, a FIFO, a socket or a folder is refused, never replaced, and
 *     so is anything under /proc or /sys (/dev/stdout leads there: '-' is standard output), a
 *     folder we may not write, a file we may not write, and a file with other hard links (a new
 *     file in its place would leave them the old bytes);
 *   - a symbolic link is followed hop by hop (each relative to the link's own folder) to the file
 *     it names, which is written; the link stays. A loop, or a chain over 40 links, is refused;
 *   - never an input of this process (`plan -o model.json --model model.json` would destroy the
 *     model), whatever name or link reaches it;
 *   - "-" is standard output, for one output of a command: moe_stdout_claim moves everything
 *     else the process prints to standard error, so the data on standard output stays clean;
 *   - atomic: a temp file in the target's folder (moeplan.tmp.XXXXXX), fsynced and renamed over
 *     it, keeping a replaced file's mode and owner; every signal that ends the process is held
 *     while the temp file exists, so an interrupted write never leaves a `*.tmp.*` file behind.
 *
 * Why process-wide state, against the rule of no mutable globals: the files a command reads are
 * found deep inside the loaders (a node XML named by a cluster, the GPU specs beside a cluster
 * file), and the guarantee "no command changes an input's bytes" must hold for all of them,
 * whatever option names the output; and standard output is the process's. The list only grows,
 * is guarded by a mutex, and holds no state that changes a result.
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
    return S_ISREG(m)    ? "a file"
           : S_ISDIR(m)  ? "a folder"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

/* Open a regular file for reading without ever blocking; `remember`: as an input of this
 * process, which no output may replace. */
static enum moe_status open_regular(const char *path, bool remember, FILE **out,
                                    struct moe_error *err)
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
    if (remember && !input_remember(&sb, path)) {
        fclose(f);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory opening %s", path);
    }
    *out = f;
    return MOE_OK;
}

enum moe_status moe_file_open_input(const char *path, FILE **out, struct moe_error *err)
{
    return open_regular(path, true, out, err);
}

bool moe_file_is_regular(const char *path)
{
    struct stat sb;
    return path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

enum moe_status moe_file_read(const char *path, enum moe_read kind, size_t max_bytes, char **text,
                              size_t *len, struct moe_error *err)
{
    FILE *f;
    enum moe_status st = open_regular(path, kind == MOE_READ_INPUT, &f, err);
    if (st != MOE_OK) return st;
    struct stat sb;
    char *buf = NULL;
    if (fstat(fileno(f), &sb) != 0) {
        st = moe_error_set_at(err, MOE_ERR_IO, path, 0, 0, "cannot stat: %s", strerror(errno));
    } else if ((uint64_t)sb.st_size > (uint64_t)max_bytes) {
        st = moe_error_set_at(err, MOE_ERR_INPUT, path, 0, 0,
                              "the file has %lld bytes, more than the %zu read here",
                              (long long)sb.st_size, max_bytes);
    } else if (!(buf = malloc((size_t)sb.st_size + 1))) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory reading %s", path);
    } else {
        size_t n = fread(buf, 1, (size_t)sb.st_size, f);
        if (n != (size_t)sb.st_size || ferror(f)) /* it shrank while read, or an I/O error */
            st = moe_error_set_at(err, MOE_ERR_IO, path, 0, 0, "read failed: %s",
                                  ferror(f) ? strerror(errno) : "the file changed while read");
        buf[n] = '\0';
        if (st == MOE_OK) *len = n;
    }
    fclose(f);
    if (st != MOE_OK) {
        free(buf);
        return st;
    }
    *text = buf;
    return MOE_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Output                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

#define LINK_HOPS 40 /* as the kernel's own limit on a path's links */

/* Standard output once a "-" output claimed it (moe_stdout_claim): the descriptor the data goes
 * to; -1 while unclaimed (then "-" is descriptor 1). */
static struct {
    pthread_mutex_t lock;
    int fd;
} claimed = {PTHREAD_MUTEX_INITIALIZER, -1};

enum moe_status moe_stdout_claim(struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    pthread_mutex_lock(&claimed.lock);
    if (claimed.fd >= 0) {
        st = moe_error_set(err, MOE_ERR_USAGE,
                           "only one output can be standard output ('-'); name a file for the "
                           "others");
    } else {
        fflush(stdout);
        int fd = fcntl(1, F_DUPFD_CLOEXEC, 3);
        if (fd < 0 || dup2(2, 1) < 0) {
            if (fd >= 0) close(fd);
            st = moe_error_set(err, MOE_ERR_IO, "standard output: %s", strerror(errno));
        } else {
            claimed.fd = fd;
        }
    }
    pthread_mutex_unlock(&claimed.lock);
    return st;
}

void moe_stdout_release(void)
{
    pthread_mutex_lock(&claimed.lock);
    if (claimed.fd >= 0) {
        fflush(stdout);
        dup2(claimed.fd, 1);
        close(claimed.fd);
        claimed.fd = -1;
    }
    pthread_mutex_unlock(&claimed.lock);
}

static int stdout_fd(void)
{
    pthread_mutex_lock(&claimed.lock);
    int fd = claimed.fd >= 0 ? claimed.fd : 1;
    pthread_mutex_unlock(&claimed.lock);
    return fd;
}

static void dir_of(const char *path, char *buf, size_t cap)
{
    char tmp[MOE_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    snprintf(buf, cap, "%s", dirname(tmp));
}

/* The path a write to `file` replaces: `file` itself, or the end of its chain of symbolic links
 * (each hop read relative to the folder of the link that names it). `exists` and `sb` describe
 * that end. Refuses a loop, an unreadable link and a path through a non-folder. */
static enum moe_status output_follow(const char *file, char *target, size_t cap, struct stat *sb,
                                     bool *exists, struct moe_error *err)
{
    char cur[MOE_PATH_MAX];
    snprintf(cur, sizeof cur, "%s", file);
    *exists = false;
    for (int hop = 0;; hop++) {
        struct stat lsb;
        if (lstat(cur, &lsb) != 0) {
            if (errno == ENOENT) break; /* a new file (or a dangling link's target) */
            if (errno == ELOOP)
                return moe_error_set(err, MOE_ERR_USAGE,
                                     "the output %s: a loop of symbolic links in its path", file);
            if (errno == ENOTDIR)
                return moe_error_set(err, MOE_ERR_USAGE,
                                     "the output %s: a part of its path is not a folder", file);
            return moe_error_set(err, MOE_ERR_USAGE, "the output %s: %s", file, strerror(errno));
        }
        if (!S_ISLNK(lsb.st_mode)) {
            *exists = true;
            *sb = lsb;
            break;
        }
        if (hop == LINK_HOPS)
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "the output %s is a loop of symbolic links (or a chain of more "
                                 "than %d)",
                                 file, LINK_HOPS);
        char link[MOE_PATH_MAX], dir[MOE_PATH_MAX], next[2 * MOE_PATH_MAX];
        ssize_t n = readlink(cur, link, sizeof link);
        if (n <= 0 || (size_t)n >= sizeof link)
            return moe_error_set(err, MOE_ERR_USAGE, "the output %s: cannot read the link %s%s%s",
                                 file, cur, n < 0 ? ": " : " (too long)",
                                 n < 0 ? strerror(errno) : "");
        link[n] = '\0';
        if (!strncmp(link, "/proc/", 6) || !strncmp(link, "/sys/", 5))
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "the output %s leads to %s, a process's descriptor or a kernel "
                                 "setting, not a file; '-' is standard output",
                                 file, link);
        dir_of(cur, dir, sizeof dir);
        if (link[0] == '/')
            snprintf(next, sizeof next, "%s", link);
        else
            snprintf(next, sizeof next, "%s/%s", dir, link);
        if (strlen(next) >= sizeof cur - 16)
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "the output %s: the link's target path is "
                                 "too long",
                                 file);
        memcpy(cur, next, strlen(next) + 1); /* it fits: checked above */
    }
    /* What the chain did not reach, the kernel may (a link of /proc such as /dev/stdout names a
     * pipe or a terminal, not a path): judge by what it opens. */
    struct stat ksb;
    if (!*exists && stat(file, &ksb) == 0) {
        *exists = true;
        *sb = ksb;
    }
    snprintf(target, cap, "%s", cur);
    return MOE_OK;
}

static const char *outputs_hint(mode_t m)
{
    return S_ISDIR(m) ? "" : "; moeplan writes regular files only ('-' is standard output)";
}

/* The output's real target, checked: a regular file or none yet, in an existing folder, not an
 * input of this process. */
/* The folder an output is written in: it exists, is a folder, is not /proc or /sys (their
 * files are kernel settings, and a temp file cannot be made there), and can be written. */
static enum moe_status output_folder(const char *file, const char *target, struct moe_error *err)
{
    char dir[MOE_PATH_MAX], real[PATH_MAX];
    struct stat dsb;
    dir_of(target, dir, sizeof dir);
    if (stat(dir, &dsb) != 0 || !S_ISDIR(dsb.st_mode))
        return moe_error_set(err, MOE_ERR_USAGE, "the output %s: the folder %s %s", file, dir,
                             stat(dir, &dsb) != 0 ? "does not exist" : "is not a folder");
    if (realpath(dir, real) && (!strcmp(real, "/proc") || !strncmp(real, "/proc/", 6) ||
                                !strcmp(real, "/sys") || !strncmp(real, "/sys/", 5)))
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output %s is in %s, whose files are a process's or the "
                             "kernel's, not files moeplan writes",
                             file, real);
    if (access(dir, W_OK) != 0)
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output %s: the folder %s is not writable (%s)", file, dir,
                             strerror(errno));
    return MOE_OK;
}

static enum moe_status output_resolve(const char *file, char *target, size_t cap, struct stat *sb,
                                      bool *exists, struct moe_error *err)
{
    if (!file || !file[0]) return moe_error_set(err, MOE_ERR_USAGE, "an empty output file name");
    if (strlen(file) >= MOE_PATH_MAX - 16)
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output path has %zu characters, more than the %d allowed",
                             strlen(file), MOE_PATH_MAX - 17);
    if (file[strlen(file) - 1] == '/')
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output %s ends in '/': that names a folder, not a file", file);
    enum moe_status st = output_follow(file, target, cap, sb, exists, err);
    if (st != MOE_OK) return st;
    const char *base = strrchr(target, '/');
    base = base ? base + 1 : target;
    if (strlen(base) > NAME_MAX)
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output %s: a file name of %zu bytes, more than the %d a folder "
                             "holds",
                             file, strlen(base), NAME_MAX);
    if ((st = output_folder(file, target, err))) return st;
    if (*exists) {
        char input[MOE_PATH_MAX];
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
        if (!S_ISREG(sb->st_mode))
            return moe_error_set(err, MOE_ERR_USAGE, "the output %s is %s, not a file%s", file,
                                 file_kind(sb->st_mode), outputs_hint(sb->st_mode));
        /* a file is replaced by a new one (atomically): one the user may not write is refused,
         * as the shell's '>' would refuse it, and so is one with other names, which would keep
         * the old bytes */
        if (access(target, W_OK) != 0)
            return moe_error_set(err, MOE_ERR_USAGE, "the output %s is not writable (%s)", file,
                                 strerror(errno));
        if (sb->st_nlink > 1)
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "the output %s has %lu names (hard links): a new file in its "
                                 "place would leave the others with the old bytes; write it "
                                 "elsewhere",
                                 file, (unsigned long)sb->st_nlink);
    }
    return MOE_OK;
}

enum moe_status moe_output_check(const char *file, struct moe_error *err)
{
    if (file && strcmp(file, "-") == 0) return MOE_OK;
    char target[MOE_PATH_MAX];
    struct stat sb;
    bool exists;
    return output_resolve(file, target, sizeof target, &sb, &exists, err);
}

enum moe_status moe_output_dir_check(const char *dir, struct moe_error *err)
{
    if (!dir || !dir[0]) return moe_error_set(err, MOE_ERR_USAGE, "an empty output folder name");
    if (!strcmp(dir, "-"))
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output '-' names a folder: standard output cannot hold one; "
                             "name a folder");
    if (strlen(dir) >= MOE_PATH_MAX - 64)
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the output folder's path has %zu characters, more than the %d "
                             "allowed",
                             strlen(dir), MOE_PATH_MAX - 65);
    char target[MOE_PATH_MAX];
    struct stat sb;
    bool exists;
    enum moe_status st = output_follow(dir, target, sizeof target, &sb, &exists, err);
    if (st != MOE_OK) return st;
    if (exists && !S_ISDIR(sb.st_mode))
        return moe_error_set(err, MOE_ERR_USAGE, "the output %s is %s, not a folder", dir,
                             file_kind(sb.st_mode));
    if (exists) { /* its files are written there: the checks of a file's folder */
        char inside[MOE_PATH_MAX + 8];
        snprintf(inside, sizeof inside, "%s/x", target);
        return output_folder(dir, inside, err);
    }
    char parent[MOE_PATH_MAX];
    struct stat psb;
    dir_of(target, parent, sizeof parent);
    if (stat(parent, &psb) != 0 || !S_ISDIR(psb.st_mode))
        return moe_error_set(
            err, MOE_ERR_USAGE, "the output folder %s: its parent %s %s (moeplan makes one level)",
            dir, parent, stat(parent, &psb) != 0 ? "does not exist" : "is not a folder");
    return output_folder(dir, target, err); /* the folder it is made in */
}

enum moe_status moe_output_dir_make(const char *dir, struct moe_error *err)
{
    enum moe_status st = moe_output_dir_check(dir, err);
    if (st != MOE_OK) return st;
    char target[MOE_PATH_MAX];
    struct stat sb;
    bool exists;
    if ((st = output_follow(dir, target, sizeof target, &sb, &exists, err))) return st;
    if (!exists && mkdir(target, 0777) != 0 && errno != EEXIST)
        return moe_error_set_at(err, MOE_ERR_IO, dir, 0, 0, "cannot make the folder: %s",
                                strerror(errno));
    if (stat(target, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return moe_error_set(err, MOE_ERR_USAGE, "the output %s is not a folder", dir);
    return MOE_OK;
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

static void fsync_parent(const char *file)
{
    char dir[MOE_PATH_MAX];
    dir_of(file, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd); /* best effort: some file systems refuse fsync of a folder */
        close(fd);
    }
}

enum moe_status moe_file_write_atomic(const char *file, const void *data, size_t len,
                                      struct moe_error *err)
{
    if (file && strcmp(file, "-") == 0) {
        fflush(stdout);
        if (write_all(stdout_fd(), data, len) != MOE_OK)
            return moe_error_set(err, MOE_ERR_IO, "standard output: write failed: %s",
                                 strerror(errno));
        return MOE_OK;
    }
    char target[MOE_PATH_MAX];
    struct stat sb;
    bool exists = false;
    enum moe_status st = output_resolve(file, target, sizeof target, &sb, &exists, err);
    if (st != MOE_OK) return st;

    /* The temp file's name does not grow with the target's (a 250-byte name stays writable). */
    char tmp[MOE_PATH_MAX + 32], dir[MOE_PATH_MAX];
    dir_of(target, dir, sizeof dir);
    snprintf(tmp, sizeof tmp, "%s/moeplan.tmp.XXXXXX", dir);
    /* Hold every signal that would end the process while the temp file exists (SIGINT, SIGTERM,
     * SIGHUP, SIGPIPE, SIGUSR1, SIGALRM, SIGXFSZ, ...): they land after the rename or the unlink,
     * so no temp file outlives the process (SIGKILL aside; faults are not held). */
    sigset_t hold, old;
    sigfillset(&hold);
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&hold, faults[i]);
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
    /* mkstemp makes the file 0600: a new output is as readable as any other file made here, and
     * a replaced one keeps its mode (and, where we may, its owner) */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, exists ? sb.st_mode & 07777 : 0666 & ~mask) != 0) goto fail;
    if (exists && (sb.st_uid != geteuid() || sb.st_gid != getegid()) &&
        fchown(fd, sb.st_uid, sb.st_gid) != 0 && errno != EPERM)
        goto fail;
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

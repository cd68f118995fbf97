/*
 * launch.c: who this process is in a multi-process run, and how the ranks agree on the NCCL id.
 *
 * One code path for the three ways to start (issue 8): `moeplan run --gpus N` (one process, a
 * thread per GPU: the ranks come from the thread index, the id through memory), `mpirun -np N
 * moeplan run` (Open MPI's OMPI_COMM_WORLD_* variables) and `srun` (Slurm's SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID). Processes pass the 128-byte id through a file every rank can
 * see: rank 0 writes it atomically, the others wait for it with a deadline, so a missing rank 0
 * ends the run with a message, not a hang. MPI itself is not needed for that.
 */
#include "exec_dist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const exec_launcher_names[] = {"single", "threads", "open-mpi", "slurm"};

/* A non-negative integer variable: 1 found, 0 absent, -1 malformed. */
static int env_int(const char *(*get)(const char *), const char *name, int *out)
{
    const char *v = get(name);
    if (!v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end || errno || x < 0 || x > 1 << 24) return -1;
    *out = (int)x;
    return 1;
}

static const char *real_getenv(const char *name)
{
    return getenv(name);
}

enum moe_status exec_launch_detect(struct exec_launch *l, const char *(*get)(const char *),
                                   struct moe_error *err)
{
    if (!get) get = real_getenv;
    static const struct {
        enum exec_launcher who;
        const char *rank, *size, *local_rank, *local_size;
    } kinds[] = {
        {EXEC_LAUNCH_MPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
         "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {EXEC_LAUNCH_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
         "SLURM_NTASKS_PER_NODE"},
    };
    memset(l, 0, sizeof *l);
    l->who = EXEC_LAUNCH_SINGLE;
    l->ranks = l->local_ranks = 1;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int rank = 0, size = 0, lrank = 0, lsize = 0;
        int a = env_int(get, kinds[k].rank, &rank), b = env_int(get, kinds[k].size, &size);
        if (a == 0 && b == 0) continue;
        int c = env_int(get, kinds[k].local_rank, &lrank);
        int d = env_int(get, kinds[k].local_size, &lsize);
        const char *bad = a < 0   ? kinds[k].rank
                          : b < 0 ? kinds[k].size
                          : c < 0 ? kinds[k].local_rank
                          : d < 0 ? kinds[k].local_size
                                  : NULL;
        if (bad)
            return moe_error_set(err, MOE_ERR_INPUT, "launch: %s='%s' is not a rank count", bad,
                                 get(bad));
        if (a == 0 || b == 0 || size < 1 || rank >= size)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "launch (%s): %s and %s must both be set, 0 <= rank < size (got "
                                 "%s, %s)",
                                 exec_launcher_names[kinds[k].who], kinds[k].rank, kinds[k].size,
                                 a ? get(kinds[k].rank) : "unset",
                                 b ? get(kinds[k].size) : "unset");
        if (c == 0) lrank = rank; /* one node */
        if (d == 0) lsize = size;
        if (lsize < 1 || lrank >= lsize || lsize > size)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "launch (%s): local rank %d of %d on a node, %d ranks in all",
                                 exec_launcher_names[kinds[k].who], lrank, lsize, size);
        l->who = kinds[k].who;
        l->rank = rank;
        l->ranks = size;
        l->local_rank = lrank;
        l->local_ranks = lsize;
        return MOE_OK;
    }
    return MOE_OK;
}

enum moe_status exec_launch_share_id(const char *path, int rank, unsigned char *id, size_t n,
                                     double timeout_s, struct moe_error *err)
{
    if (rank == 0) return moe_file_write_atomic(path, id, n, err);
    double t0 = moe_time_now_s();
    for (;;) {
        if (moe_file_is_regular(path)) {
            char *text;
            size_t got;
            enum moe_status st = moe_file_read(path, MOE_READ_OWN_STATE, n, &text, &got, err);
            if (st == MOE_OK && got == n) memcpy(id, text, n);
            if (st == MOE_OK) free(text);
            if (st == MOE_OK && got == n) return MOE_OK;
            if (st == MOE_ERR_IO || st == MOE_ERR_NOMEM) return st;
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "launch: %s does not hold a %zu-byte NCCL id (a stale file of "
                                 "another run? remove it)",
                                 path, n);
        }
        if (moe_time_now_s() - t0 > timeout_s)
            return moe_error_set(err, MOE_ERR_RUNTIME,
                                 "launch: rank %d waited %g s for rank 0 to write %s; is rank 0 "
                                 "running, and is the folder shared by every node?",
                                 rank, timeout_s, path);
        struct timespec nap = {0, 5000000};
        nanosleep(&nap, NULL);
    }
}

/* A worker of a distributed job, through synkv's C API: run it under the launcher, e.g.
 *
 *     synkv launch -n 2 -s 2 -- ./dist_capi int      (or str)
 *
 * (crates/synkv-capi/tests/dist.rs compiles it and does exactly that, once per key kind: a
 * store holds int keys or str keys, not both, as in MXNet). Every worker creates a dist_sync
 * store, checks its rank, worker count and type, initialises small keys and a big one (split
 * over the servers), and pushes ones * (rank + 1):
 *   - no optimizer: every pull is the sum over workers, n(n+1)/2 (MXNet's assign semantics);
 *   - the Test optimizer with rescale_grad 2 (w += 2 * sum): 1 + 2 * n(n+1)/2 * round;
 *   - SGD with learning rate 0.1 (w -= 0.1 * sum): 1 - 0.1 * n(n+1)/2 * round.
 * A barrier separates the phases (an optimizer must not change under another worker's
 * pushes). Prints one line per failed check and "dist_capi ok (rank r of n workers)" plus
 * "N passed, M failed"; exits non-zero when a check failed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synkv.h"

static int passed, failed, rank = -1;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            printf("FAIL rank %d %s:%d: %s: ", rank, __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                            \
            printf(" (last error: %s)\n", synkv_get_last_error());          \
        }                                                                   \
    } while (0)
#define OK(call) EXPECT((call) == SYNKV_OK, "%s", #call)
/* A failed call leaves the job in an unknown state: stop this worker (the launcher stops the
 * others). */
#define MUST(call)                                                                       \
    do {                                                                                 \
        if ((call) != SYNKV_OK) {                                                        \
            printf("FAIL rank %d: %s: %s\n", rank, #call, synkv_get_last_error());        \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* A float32 buffer with a view. */
typedef struct {
    float *d;
    size_t n;
    SynkvArray *v;
} Buf;

static Buf buf(uint32_t ndim, const uint64_t *shape, float value) {
    Buf b;
    b.n = 1;
    for (uint32_t i = 0; i < ndim; i++) b.n *= shape[i];
    b.d = malloc(b.n * sizeof(float));
    if (!b.d) abort();
    for (size_t i = 0; i < b.n; i++) b.d[i] = value;
    MUST(synkv_array_view(b.d, SYNKV_DTYPE_F32, ndim, shape, &b.v));
    return b;
}

static void fill(Buf *b, float value) {
    for (size_t i = 0; i < b->n; i++) b->d[i] = value;
}

static void unbuf(Buf *b) {
    synkv_array_free(b->v);
    free(b->d);
}

/* The index of the first element of `b` farther than tol (relative) from `want`, or -1. */
static long off(const Buf *b, double want, double tol) {
    for (size_t i = 0; i < b->n; i++)
        if (fabs(b->d[i] - want) > tol * fmax(1.0, fabs(want))) return (long)i;
    return -1;
}

static const uint64_t SMALL[2] = {2, 3};
static const uint64_t BIG[2] = {1200, 1200}; /* 1.44M elements: split over every server */

/* Keys of one kind: int keys, or the str keys. */
typedef struct {
    int is_str;
    const int32_t *ints;
    const char *const *strs;
} Keys;

static int init(SynkvKV *kv, Keys k, SynkvArray *const *v) { return k.is_str ? synkv_kv_init_str(kv, 2, k.strs, v) : synkv_kv_init_int(kv, 2, k.ints, v); }
static int push(SynkvKV *kv, Keys k, SynkvArray *const *v) {
    return k.is_str ? synkv_kv_push_str(kv, 2, k.strs, NULL, v, 0) : synkv_kv_push_int(kv, 2, k.ints, NULL, v, 0);
}
static int pull(SynkvKV *kv, Keys k, SynkvArray *const *v) {
    return k.is_str ? synkv_kv_pull_str(kv, 2, k.strs, NULL, v, 0) : synkv_kv_pull_int(kv, 2, k.ints, NULL, v, 0);
}

/* Keys `keys` (a 2x3 one, then a 1200x1200 one), both initialised to `init_value`;
 * `nrounds` pushes of rank + 1, each followed by a pull that must give `expect(n, round)`. */
static void rounds(SynkvKV *kv, const char *phase, Keys keys, float init_value, int nrounds, double (*expect)(int n, int round), int n) {
    Buf small = buf(2, SMALL, init_value), big = buf(2, BIG, init_value);
    Buf gsmall = buf(2, SMALL, (float)(rank + 1)), gbig = buf(2, BIG, (float)(rank + 1));
    Buf osmall = buf(2, SMALL, -1), obig = buf(2, BIG, -1);
    SynkvArray *vals[2] = {small.v, big.v}, *grads[2] = {gsmall.v, gbig.v}, *outs[2] = {osmall.v, obig.v};
    OK(init(kv, keys, vals));
    for (int r = 1; r <= nrounds; r++) {
        OK(push(kv, keys, grads));
        OK(pull(kv, keys, outs));
        OK(synkv_kv_wait_all(kv));
        double want = expect(n, r);
        const Buf *got[2] = {&osmall, &obig};
        for (int k = 0; k < 2; k++) {
            long i = off(got[k], want, 1e-5);
            EXPECT(i < 0, "%s, round %d, %s key %d: element %ld is %g, expected %g", phase, r, k ? "big" : "small", k, i,
                   i < 0 ? 0.0 : got[k]->d[i], want);
        }
        fill(&osmall, -1);
        fill(&obig, -1);
    }
    unbuf(&small);
    unbuf(&big);
    unbuf(&gsmall);
    unbuf(&gbig);
    unbuf(&osmall);
    unbuf(&obig);
}

static double tri(int n) { return n * (n + 1) / 2.0; }
static double assign_sum(int n, int round) {
    (void)round;
    return tri(n);
}
static double test_opt(int n, int round) { return 1.0 + 2.0 * tri(n) * round; }
static double sgd(int n, int round) { return 1.0 - 0.1 * tri(n) * round; }

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "int") != 0 && strcmp(argv[1], "str") != 0)) {
        fprintf(stderr, "usage: %s int|str (the kind of keys to use), under synkv launch\n", argv[0]);
        return 2;
    }
    int is_str = strcmp(argv[1], "str") == 0;
    SynkvKV *kv;
    MUST(synkv_kv_create("dist_sync", &kv));
    int n = 0;
    const char *type = NULL;
    MUST(synkv_kv_rank(kv, &rank));
    OK(synkv_kv_num_workers(kv, &n));
    OK(synkv_kv_type(kv, &type));
    const char *env_n = getenv("DMLC_NUM_WORKER"), *env_task = getenv("DMLC_TASK_ID");
    EXPECT(env_n && n == atoi(env_n), "num_workers %d, DMLC_NUM_WORKER %s", n, env_n ? env_n : "(unset)");
    /* Under the launcher, worker i has rank i. */
    EXPECT(env_task && rank == atoi(env_task), "rank %d, DMLC_TASK_ID %s", rank, env_task ? env_task : "(unset)");
    EXPECT(type && strcmp(type, "dist_sync") == 0, "type %s", type ? type : "(null)");
    if (n < 1) n = 1;

    const int32_t ints[3][2] = {{3, 99}, {5, 100}, {7, 101}};
    const char *const strs[3][2] = {{"w", "big_w"}, {"opt_w", "opt_big_w"}, {"sgd_w", "sgd_big_w"}};
    Keys phase[3];
    for (int i = 0; i < 3; i++) phase[i] = (Keys){is_str, ints[i], strs[i]};
    rounds(kv, "assign", phase[0], 0, 2, assign_sum, n);
    OK(synkv_kv_barrier(kv));

    const char *rescale[1] = {"rescale_grad"}, *two[1] = {"2"};
    OK(synkv_kv_set_optimizer(kv, "test", 1, rescale, two));
    rounds(kv, "test optimizer", phase[1], 1, 2, test_opt, n);
    OK(synkv_kv_barrier(kv));

    const char *lr[1] = {"learning_rate"}, *tenth[1] = {"0.1"};
    OK(synkv_kv_set_optimizer(kv, "sgd", 1, lr, tenth));
    rounds(kv, "sgd", phase[2], 1, 2, sgd, n);
    OK(synkv_kv_barrier(kv));

    /* A checkpoint of the servers (every worker calls it, like a barrier) when the test asks. */
    const char *ckpt = getenv("DIST_CAPI_CHECKPOINT_DIR");
    if (ckpt != NULL) {
        uint64_t id = 0, round = 0;
        OK(synkv_kv_checkpoint(kv, ckpt, &id, &round));
        EXPECT(id >= 1 && round > 0, "checkpoint id %llu at round %llu", (unsigned long long)id, (unsigned long long)round);
        int64_t resumed = 0;
        OK(synkv_kv_resumed_round(kv, &resumed));
        EXPECT(resumed == -1, "a fresh job resumed from round %lld", (long long)resumed);
    }

    /* Closes the store: waits until every worker is done, then the servers exit. A failure to
     * leave the cluster cleanly is an error status (then exit non-zero). */
    OK(synkv_kv_close(kv));
    OK(synkv_kv_free(kv));
    if (failed == 0) printf("dist_capi %s ok (rank %d of %d workers)\n", argv[1], rank, n);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

/* Assertions on synkv's C API, run by crates/synkv-capi/tests/c_programs.rs (or by hand: see
 * tutorial.c for the build line). Prints one line per failed check and a final
 * "N passed, M failed"; exits non-zero when a check failed.
 *
 * The numbers are MXNet's KVStore tests' (spec K11: T3 init, T1 single, T5 list, T6 aggregator,
 * T8 updater, T2 row_sparse_pull, T7 sparse aggregator, T10 invalid pulls, T11/T13 broadcast
 * and pushpull), run through the C ABI. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "synkv.h"

static int passed, failed;

#define EXPECT(cond, ...)                                              \
    do {                                                               \
        if (cond) {                                                    \
            passed++;                                                  \
        } else {                                                       \
            failed++;                                                  \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            printf(__VA_ARGS__);                                       \
            printf(" (last error: %s)\n", synkv_get_last_error());     \
        }                                                              \
    } while (0)
#define OK(call) EXPECT((call) == SYNKV_OK, "%s", #call)
#define FAILS(call, code, text) \
    EXPECT((call) == (code) && strstr(synkv_get_last_error(), (text)) != NULL, "%s should fail with %s", #call, text)

enum { R = 4, C = 4, N = R * C };
static const uint64_t SHAPE[2] = {R, C};

/* A 4x4 float32 buffer with a view. */
typedef struct {
    float d[N];
    SynkvArray *v;
} Buf;

static Buf *buf(float value) {
    Buf *b = malloc(sizeof *b);
    for (int i = 0; i < N; i++) b->d[i] = value;
    if (synkv_array_view(b->d, SYNKV_DTYPE_F32, 2, SHAPE, &b->v) != SYNKV_OK) abort();
    return b;
}

static void unbuf(Buf *b) {
    synkv_array_free(b->v);
    free(b);
}

static int all_eq(const float *d, int n, float x) {
    for (int i = 0; i < n; i++)
        if (d[i] != x) return 0;
    return 1;
}

/* A local store with key 3 and keys 5, 7, 9 initialised to zeros. */
static const int32_t KEYS[3] = {5, 7, 9};
static SynkvKV *init_kv(void) {
    SynkvKV *kv;
    int32_t k3 = 3;
    if (synkv_kv_create("local", &kv) != SYNKV_OK) abort();
    Buf *z = buf(0);
    SynkvArray *zs[3] = {z->v, z->v, z->v};
    OK(synkv_kv_init_int(kv, 1, &k3, &z->v));
    OK(synkv_kv_init_int(kv, 3, KEYS, zs));
    unbuf(z);
    return kv;
}

/* stored += recv (float32, dense), recording the thread it ran on. */
static pthread_t last_thread;
static int add_update(int32_t key, SynkvArray *recv, SynkvArray *stored, void *user_data) {
    float *in, *out;
    (void)key;
    last_thread = pthread_self();
    if (user_data) ++*(int *)user_data;
    if (synkv_array_data(recv, (void **)&in) || synkv_array_data(stored, (void **)&out)) return 1;
    for (int i = 0; i < N; i++) out[i] += in[i];
    return 0;
}
static int add_update_str(const char *key, SynkvArray *recv, SynkvArray *stored, void *user_data) {
    (void)key;
    return add_update(0, recv, stored, user_data);
}
static int failing_update(int32_t key, SynkvArray *recv, SynkvArray *stored, void *user_data) {
    (void)key, (void)recv, (void)stored, (void)user_data;
    synkv_set_last_error("bad gradient");
    return 7;
}

static void test_basics(void) {
    SynkvKV *kv;
    const char *type;
    int rank = -1, workers = -1;
    EXPECT(strlen(synkv_version()) > 0, "version");
    OK(synkv_kv_create("Local_Allreduce_CPU", &kv));
    OK(synkv_kv_type(kv, &type));
    EXPECT(strcmp(type, "local_allreduce_cpu") == 0, "type round-trip: %s", type);
    OK(synkv_kv_rank(kv, &rank));
    OK(synkv_kv_num_workers(kv, &workers));
    EXPECT(rank == 0 && workers == 1, "rank %d workers %d", rank, workers);
    OK(synkv_kv_barrier(kv));
    OK(synkv_kv_free(kv));
    OK(synkv_kv_free(NULL));
    OK(synkv_array_free(NULL));
    FAILS(synkv_kv_create("foo", &kv), SYNKV_ERR_STORE, "unknown store type");
    FAILS(synkv_kv_create(NULL, &kv), SYNKV_ERR_NULL, "type is NULL");
    FAILS(synkv_kv_push_int(NULL, 0, NULL, NULL, NULL, 0), SYNKV_ERR_NULL, "kv is NULL");
    SynkvArray *a;
    float x[4];
    uint64_t shape[1] = {4};
    FAILS(synkv_array_view(NULL, SYNKV_DTYPE_F32, 1, shape, &a), SYNKV_ERR_NULL, "data is NULL");
    FAILS(synkv_array_view(x, 3, 1, shape, &a), SYNKV_ERR_ARGUMENT, "unknown dtype code 3");
    FAILS(synkv_array_view((char *)x + 1, SYNKV_DTYPE_F32, 1, shape, &a), SYNKV_ERR_ARGUMENT, "not aligned");
}

static void test_push_pull(void) {
    int32_t k3 = 3;
    /* T3 init → 4 */
    SynkvKV *kv;
    OK(synkv_kv_create("local", &kv));
    Buf *four = buf(4), *out = buf(0);
    OK(synkv_kv_init_int(kv, 1, &k3, &four->v));
    OK(synkv_kv_pull_int(kv, 1, &k3, NULL, &out->v, 0));
    EXPECT(all_eq(out->d, N, 4), "init → 4");
    FAILS(synkv_kv_init_int(kv, 1, &k3, &four->v), SYNKV_ERR_STORE, "duplicate init of key 3");
    int32_t k4 = 4;
    FAILS(synkv_kv_pull_int(kv, 1, &k4, NULL, &out->v, 0), SYNKV_ERR_STORE, "has not been initialised");
    const char *ka = "a";
    FAILS(synkv_kv_pull_str(kv, 1, &ka, NULL, &out->v, 0), SYNKV_ERR_STORE, "mixed key types");
    SynkvArray *nulls[1] = {NULL};
    FAILS(synkv_kv_push_int(kv, 1, &k3, NULL, nulls, 0), SYNKV_ERR_NULL, "vals[0] is NULL");
    uint64_t small[1] = {3};
    SynkvArray *wrong;
    OK(synkv_array_create(SYNKV_DTYPE_F32, 1, small, &wrong));
    FAILS(synkv_kv_push_int(kv, 1, &k3, NULL, &wrong, 0), SYNKV_ERR_STORE, "shape mismatch");
    synkv_array_free(wrong);
    unbuf(four), unbuf(out);
    OK(synkv_kv_free(kv));

    /* T1 single → 1, T5 list → 4 */
    kv = init_kv();
    Buf *one = buf(1), *o = buf(0);
    OK(synkv_kv_push_int(kv, 1, &k3, NULL, &one->v, 5 /* priority */));
    OK(synkv_kv_pull_int(kv, 1, &k3, NULL, &o->v, 0));
    EXPECT(all_eq(o->d, N, 1), "single → 1");
    Buf *v[3], *w[3];
    SynkvArray *vv[3], *wv[3];
    for (int i = 0; i < 3; i++) v[i] = buf(4), w[i] = buf(0), vv[i] = v[i]->v, wv[i] = w[i]->v;
    OK(synkv_kv_push_int(kv, 3, KEYS, NULL, vv, 0));
    OK(synkv_kv_pull_int(kv, 3, KEYS, NULL, wv, 0));
    for (int i = 0; i < 3; i++) EXPECT(all_eq(w[i]->d, N, 4), "list key %d → 4", KEYS[i]);
    for (int i = 0; i < 3; i++) unbuf(v[i]), unbuf(w[i]);
    unbuf(one), unbuf(o);
    OK(synkv_kv_free(kv));
}

static void test_aggregator(void) {
    /* T6: 4 devices → 4; lists × 2 → 8 (pulled back into the pushed arrays) */
    int32_t k3 = 3;
    SynkvKV *kv = init_kv();
    Buf *d[4];
    SynkvArray *dv[4];
    uint32_t four = 4, counts[3] = {4, 4, 4};
    for (int i = 0; i < 4; i++) d[i] = buf(1), dv[i] = d[i]->v;
    OK(synkv_kv_push_int(kv, 1, &k3, &four, dv, 0));
    OK(synkv_kv_pull_int(kv, 1, &k3, &four, dv, 0));
    for (int i = 0; i < 4; i++) EXPECT(all_eq(d[i]->d, N, 4), "device %d → 4", i);
    for (int i = 0; i < 4; i++) unbuf(d[i]);
    Buf *l[12];
    SynkvArray *lv[12];
    for (int i = 0; i < 12; i++) l[i] = buf(2), lv[i] = l[i]->v;
    OK(synkv_kv_push_int(kv, 3, KEYS, counts, lv, 0));
    OK(synkv_kv_pull_int(kv, 3, KEYS, counts, lv, 0));
    for (int i = 0; i < 12; i++) EXPECT(all_eq(l[i]->d, N, 8), "list value %d → 8", i);
    for (int i = 0; i < 12; i++) unbuf(l[i]);
    OK(synkv_kv_free(kv));
}

static void test_updater(int thread) {
    /* T8: stored += input; 4 devices → 4; list pushed 10 times → 40 */
    int32_t k3 = 3;
    int calls = 0;
    SynkvKV *kv = init_kv();
    OK(synkv_kv_set_updater(kv, add_update, NULL, &calls, thread));
    Buf *d[12];
    SynkvArray *dv[12];
    uint32_t four = 4, counts[3] = {4, 4, 4};
    for (int i = 0; i < 12; i++) d[i] = buf(1), dv[i] = d[i]->v;
    OK(synkv_kv_push_int(kv, 1, &k3, &four, dv, 0));
    OK(synkv_kv_pull_int(kv, 1, &k3, &four, dv, 0));
    for (int i = 0; i < 4; i++) EXPECT(all_eq(d[i]->d, N, 4), "updater, device %d → 4", i);
    int same = pthread_equal(last_thread, pthread_self());
    EXPECT(thread == SYNKV_UPDATER_CALLER_THREAD ? same : !same, "updater thread (mode %d)", thread);
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < N; j++) d[i]->d[j] = 1;
    for (int r = 0; r < 10; r++) OK(synkv_kv_push_int(kv, 3, KEYS, counts, dv, 0));
    OK(synkv_kv_pull_int(kv, 3, KEYS, counts, dv, 0));
    for (int i = 0; i < 12; i++) EXPECT(all_eq(d[i]->d, N, 40), "updater, list value %d → 40", i);
    OK(synkv_kv_wait_all(kv));
    EXPECT(calls == 1 + 30, "updater called once per key per push: %d", calls);
    for (int i = 0; i < 12; i++) unbuf(d[i]);
    OK(synkv_kv_free(kv));
}

static void test_updater_errors_and_str_keys(void) {
    int32_t k3 = 3;
    SynkvKV *kv = init_kv();
    Buf *one = buf(1), *o = buf(0);
    OK(synkv_kv_set_updater(kv, failing_update, NULL, NULL, SYNKV_UPDATER_ENGINE_THREAD));
    OK(synkv_kv_push_int(kv, 1, &k3, NULL, &one->v, 0));
    FAILS(synkv_kv_pull_int(kv, 1, &k3, NULL, &o->v, 0), SYNKV_ERR_ENGINE, "bad gradient");
    OK(synkv_kv_pull_int(kv, 1, &k3, NULL, &o->v, 0));
    EXPECT(all_eq(o->d, N, 0), "a failed update keeps the stored value");
    FAILS(synkv_kv_wait_all(kv), SYNKV_ERR_ENGINE, "returned 7");
    OK(synkv_kv_wait_all(kv));
    OK(synkv_kv_clear_updater(kv));
    OK(synkv_kv_free(kv));

    /* str keys, str updater on the caller's thread */
    const char *keys[2] = {"b", "c"};
    OK(synkv_kv_create("local", &kv));
    Buf *z = buf(0);
    SynkvArray *zz[2] = {z->v, z->v};
    OK(synkv_kv_init_str(kv, 2, keys, zz));
    FAILS(synkv_kv_push_int(kv, 1, &k3, NULL, &one->v, 0), SYNKV_ERR_STORE, "mixed key types");
    FAILS(synkv_kv_set_updater(kv, NULL, NULL, NULL, 0), SYNKV_ERR_NULL, "both int_fn and str_fn");
    OK(synkv_kv_set_updater(kv, NULL, add_update_str, NULL, SYNKV_UPDATER_CALLER_THREAD));
    SynkvArray *ones[2] = {one->v, one->v};
    OK(synkv_kv_push_str(kv, 2, keys, NULL, ones, 0));
    EXPECT(pthread_equal(last_thread, pthread_self()), "caller-thread str updater");
    OK(synkv_kv_push_str(kv, 2, keys, NULL, ones, 0));
    OK(synkv_kv_pull_str(kv, 1, keys + 1, NULL, &o->v, 0));
    EXPECT(all_eq(o->d, N, 2), "str updater → 2");
    /* an int-only updater on a str store fails the update */
    OK(synkv_kv_set_updater(kv, add_update, NULL, NULL, SYNKV_UPDATER_ENGINE_THREAD));
    OK(synkv_kv_push_str(kv, 1, keys, NULL, &one->v, 0));
    FAILS(synkv_kv_pull_str(kv, 1, keys, NULL, &o->v, 0), SYNKV_ERR_ENGINE, "no str-key callback");
    synkv_kv_wait_all(kv);
    unbuf(one), unbuf(o), unbuf(z);
    OK(synkv_kv_free(kv));
}

static void test_owned_pushpull_broadcast(void) {
    SynkvKV *kv;
    int32_t k = 6;
    uint64_t shape[2] = {2, 2};
    OK(synkv_kv_create("device", &kv));
    /* broadcast ones (an owned f64 array) into 3 owned outputs → 1 */
    SynkvArray *val, *outs[3];
    double ones[4] = {1, 1, 1, 1}, got[4];
    OK(synkv_array_create(SYNKV_DTYPE_F64, 2, shape, &val));
    OK(synkv_array_write(val, ones, sizeof ones));
    FAILS(synkv_array_write(val, ones, 3), SYNKV_ERR_ARGUMENT, "buffer of 3 bytes");
    for (int i = 0; i < 3; i++) OK(synkv_array_create(SYNKV_DTYPE_F64, 2, shape, &outs[i]));
    uint32_t three = 3;
    OK(synkv_kv_broadcast_int(kv, 1, &k, &val, &three, outs, 0));
    for (int i = 0; i < 3; i++) {
        double *p;
        OK(synkv_array_data(outs[i], (void **)&p));
        EXPECT(p[0] == 1 && p[3] == 1, "broadcast output %d → 1", i);
    }
    FAILS(synkv_kv_broadcast_int(kv, 1, &k, &val, &three, outs, 0), SYNKV_ERR_STORE, "duplicate init");
    /* pushpull: 3 values of 1 → 2 outputs get 3; then in place on those two: 3 + 3 = 6 */
    uint32_t two = 2;
    OK(synkv_kv_pushpull_int(kv, 1, &k, &three, outs, &two, outs, 0));
    OK(synkv_array_read(outs[0], got, sizeof got));
    EXPECT(got[0] == 3 && got[3] == 3, "pushpull → 3: %g", got[0]);
    OK(synkv_kv_pushpull_int(kv, 1, &k, &two, outs, NULL, NULL, 0));
    OK(synkv_array_read(outs[1], got, sizeof got));
    EXPECT(got[0] == 6, "pushpull in place → 6: %g", got[0]);
    uint32_t ndim;
    const uint64_t *dims;
    OK(synkv_array_shape(outs[1], &ndim, &dims));
    EXPECT(ndim == 2 && dims[0] == 2 && dims[1] == 2, "shape");
    int dtype;
    OK(synkv_array_dtype(outs[1], &dtype));
    EXPECT(dtype == SYNKV_DTYPE_F64, "dtype");
    /* float16 values pulled into a float32 view are converted */
    int32_t kh = 7;
    uint16_t half_ones[4] = {0x3C00, 0x3C00, 0x3C00, 0x3C00};
    float f[4] = {0};
    SynkvArray *h, *fv;
    OK(synkv_array_view(half_ones, SYNKV_DTYPE_F16, 2, shape, &h));
    OK(synkv_array_view(f, SYNKV_DTYPE_F32, 2, shape, &fv));
    OK(synkv_kv_init_int(kv, 1, &kh, &h));
    OK(synkv_kv_pull_int(kv, 1, &kh, NULL, &fv, 0));
    EXPECT(f[0] == 1 && f[3] == 1, "f16 → f32 pull: %g", f[0]);
    synkv_array_free(h), synkv_array_free(fv), synkv_array_free(val);
    for (int i = 0; i < 3; i++) synkv_array_free(outs[i]);
    OK(synkv_kv_free(kv));
}

static void test_row_sparse(void) {
    SynkvKV *kv;
    const char *e = "e";
    OK(synkv_kv_create("local", &kv));
    /* T2: key 'e' holds ones in every row; pull rows {1, 3} (ids given unsorted, repeated) */
    int64_t all[R] = {0, 1, 2, 3};
    float onesd[N], ids[4] = {3, 1, 1, 3}, dense[N];
    for (int i = 0; i < N; i++) onesd[i] = 1;
    SynkvArray *init, *out, *rid, *dout;
    OK(synkv_array_row_sparse(SYNKV_DTYPE_F32, 2, SHAPE, R, all, onesd, sizeof onesd, &init));
    OK(synkv_kv_init_str(kv, 1, &e, &init));
    OK(synkv_array_row_sparse(SYNKV_DTYPE_F32, 2, SHAPE, 0, NULL, NULL, 0, &out));
    uint64_t idshape[2] = {2, 2};
    OK(synkv_array_view(ids, SYNKV_DTYPE_F32, 2, idshape, &rid));
    OK(synkv_kv_row_sparse_pull_str(kv, 1, &e, NULL, &out, &rid, 0));
    uint64_t nrows = 0;
    int64_t got_ids[2];
    float rows[2 * C];
    OK(synkv_array_row_sparse_nrows(out, &nrows));
    EXPECT(nrows == 2, "two rows pulled: %llu", (unsigned long long)nrows);
    OK(synkv_array_row_sparse_read(out, got_ids, 2, rows, sizeof rows));
    EXPECT(got_ids[0] == 1 && got_ids[1] == 3 && all_eq(rows, 2 * C, 1), "rows 1 and 3 are ones");
    OK(synkv_array_read(out, dense, sizeof dense));
    EXPECT(all_eq(dense, C, 0) && all_eq(dense + C, C, 1) && all_eq(dense + 2 * C, C, 0), "other rows are zeros");
    OK(synkv_array_create(SYNKV_DTYPE_F32, 2, SHAPE, &dout));
    FAILS(synkv_kv_row_sparse_pull_str(kv, 1, &e, NULL, &dout, &rid, 0), SYNKV_ERR_STORE, "row_sparse");
    void *p;
    FAILS(synkv_array_data(out, &p), SYNKV_ERR_ARGUMENT, "no dense data pointer");

    /* T7: four row_sparse values summed; every output pulls all rows → Σ outputs = 4 Σ inputs */
    const char *a = "a";
    SynkvArray *z, *vals[4], *outs[4], *allids[4];
    OK(synkv_array_row_sparse(SYNKV_DTYPE_F32, 2, SHAPE, 0, NULL, NULL, 0, &z));
    OK(synkv_kv_init_str(kv, 1, &a, &z));
    float expect[N] = {0};
    float allf[R] = {0, 1, 2, 3};
    uint64_t four_shape[1] = {R};
    for (int i = 0; i < 4; i++) {
        int64_t row[1] = {i % 3};
        float data[C];
        for (int j = 0; j < C; j++) data[j] = (float)(i + j), expect[(i % 3) * C + j] += (float)(i + j);
        OK(synkv_array_row_sparse(SYNKV_DTYPE_F32, 2, SHAPE, 1, row, data, sizeof data, &vals[i]));
        OK(synkv_array_row_sparse(SYNKV_DTYPE_F32, 2, SHAPE, 0, NULL, NULL, 0, &outs[i]));
        OK(synkv_array_view(allf, SYNKV_DTYPE_F32, 1, four_shape, &allids[i]));
    }
    uint32_t four = 4;
    OK(synkv_kv_push_str(kv, 1, &a, &four, vals, 0));
    OK(synkv_kv_row_sparse_pull_str(kv, 1, &a, &four, outs, allids, 0));
    int sums_ok = 1;
    for (int i = 0; i < 4; i++) {
        OK(synkv_array_read(outs[i], dense, sizeof dense));
        for (int j = 0; j < N; j++) sums_ok &= dense[j] == expect[j];
    }
    EXPECT(sums_ok, "sparse aggregator: every output holds the sum");

    /* T10: pull into a row_sparse output is skipped unless ignore_sparse = 0 */
    const char *d = "d";
    SynkvArray *twos, *rs;
    float twof[N];
    for (int i = 0; i < N; i++) twof[i] = 2;
    OK(synkv_array_view(twof, SYNKV_DTYPE_F32, 2, SHAPE, &twos));
    OK(synkv_kv_init_str(kv, 1, &d, &twos));
    OK(synkv_array_row_sparse(SYNKV_DTYPE_F32, 2, SHAPE, 0, NULL, NULL, 0, &rs));
    uint32_t skipped = 0;
    OK(synkv_kv_pull_with_sparse_str(kv, 1, &d, NULL, &rs, 0, 1, &skipped));
    OK(synkv_array_row_sparse_nrows(rs, &nrows));
    EXPECT(skipped == 1 && nrows == 0, "ignore_sparse skips (%u skipped, %llu rows)", skipped, (unsigned long long)nrows);
    OK(synkv_kv_pull_with_sparse_str(kv, 1, &d, NULL, &rs, 0, 0, &skipped));
    OK(synkv_array_read(rs, dense, sizeof dense));
    EXPECT(skipped == 0 && all_eq(dense, N, 2), "ignore_sparse = 0 pulls every row");

    synkv_array_free(init), synkv_array_free(out), synkv_array_free(rid), synkv_array_free(dout);
    synkv_array_free(z), synkv_array_free(twos), synkv_array_free(rs);
    for (int i = 0; i < 4; i++) synkv_array_free(vals[i]), synkv_array_free(outs[i]), synkv_array_free(allids[i]);
    OK(synkv_kv_free(kv));
}

static int near(float a, float b) { return a - b < 1e-5f && b - a < 1e-5f; }

static void test_optimizer(void) {
    SynkvKV *kv;
    int32_t k3 = 3;
    char path[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/synkv-capi-states-%ld.bin", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    OK(synkv_kv_create("local", &kv));
    Buf *w = buf(1), *g = buf(1), *o = buf(0);
    OK(synkv_kv_init_int(kv, 1, &k3, &w->v));
    FAILS(synkv_kv_save_optimizer_states(kv, path), SYNKV_ERR_STORE, "no optimizer is installed");
    const char *names[2] = {"learning_rate", "momentum"}, *values[2] = {"0.1", "0.9"};
    const char *typo[1] = {"momentun"};
    FAILS(synkv_kv_set_optimizer(kv, "sgd", 1, typo, values + 1), SYNKV_ERR_OPTIMIZER, "momentun");
    FAILS(synkv_kv_set_optimizer(kv, "nosuch", 0, NULL, NULL), SYNKV_ERR_OPTIMIZER, "nosuch");
    /* SGD, lr 0.1, momentum 0.9, gradient 1: m = -0.1, w = 0.9; then m = -0.19, w = 0.71 */
    OK(synkv_kv_set_optimizer(kv, "SGD", 2, names, values));
    OK(synkv_kv_push_int(kv, 1, &k3, NULL, &g->v, 0));
    OK(synkv_kv_pull_int(kv, 1, &k3, NULL, &o->v, 0));
    EXPECT(near(o->d[0], 0.9f), "sgd step 1: %g", o->d[0]);
    OK(synkv_kv_save_optimizer_states(kv, path));
    OK(synkv_kv_push_int(kv, 1, &k3, NULL, &g->v, 0));
    OK(synkv_kv_pull_int(kv, 1, &k3, NULL, &o->v, 0));
    EXPECT(near(o->d[0], 0.71f), "sgd step 2: %g", o->d[0]);
    /* back to the momentum after step 1 (-0.1): m = -0.19 again, w = 0.71 - 0.19 */
    OK(synkv_kv_load_optimizer_states(kv, path));
    OK(synkv_kv_push_int(kv, 1, &k3, NULL, &g->v, 0));
    OK(synkv_kv_pull_int(kv, 1, &k3, NULL, &o->v, 0));
    EXPECT(near(o->d[0], 0.52f), "sgd after load: %g", o->d[0]);
    remove(path);
    /* the JSON form: the test optimizer, w += rescale_grad * g */
    OK(synkv_kv_set_optimizer_json(kv, "{\"name\": \"test\", \"common\": {\"rescale_grad\": 2}}"));
    OK(synkv_kv_push_int(kv, 1, &k3, NULL, &g->v, 0));
    OK(synkv_kv_pull_int(kv, 1, &k3, NULL, &o->v, 0));
    EXPECT(near(o->d[0], 2.52f), "test optimizer: %g", o->d[0]);
    FAILS(synkv_kv_set_optimizer_json(kv, "{"), SYNKV_ERR_OPTIMIZER, "");
    unbuf(w), unbuf(g), unbuf(o);
    OK(synkv_kv_free(kv));
}

int main(void) {
    test_basics();
    test_push_pull();
    test_aggregator();
    test_updater(SYNKV_UPDATER_ENGINE_THREAD);
    test_updater(SYNKV_UPDATER_CALLER_THREAD);
    test_updater_errors_and_str_keys();
    test_owned_pushpull_broadcast();
    test_row_sparse();
    test_optimizer();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

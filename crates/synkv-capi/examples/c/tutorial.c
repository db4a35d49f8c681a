/* The KVStore tutorial through synkv's C API: the steps of MXNet's Perl/Python KVStore
 * tutorial on a `local` store, printing each pulled array (PDL's format).
 *
 * Build (from the repository root, after `cargo build -p synkv-capi`):
 *   cc -Icrates/synkv-capi/include crates/synkv-capi/examples/c/tutorial.c \
 *      target/debug/libsynkv_capi.a -lpthread -ldl -lm -o tutorial
 * or against the shared library:
 *   cc ... -Ltarget/debug -lsynkv_capi -Wl,-rpath,$PWD/target/debug
 */
#include <stdio.h>
#include <stdlib.h>

#include "synkv.h"

#define CHECK(call)                                                                  \
    do {                                                                             \
        if ((call) != SYNKV_OK) {                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,     \
                    synkv_get_last_error());                                         \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

enum { ROWS = 2, COLS = 3, N = ROWS * COLS };
static const uint64_t SHAPE[2] = {ROWS, COLS};

/* A 2x3 float32 buffer and a zero-copy view of it. */
typedef struct {
    float data[N];
    SynkvArray *view;
} Arr;

static void arr_init(Arr *a, float value) {
    for (int i = 0; i < N; i++) a->data[i] = value;
    CHECK(synkv_array_view(a->data, SYNKV_DTYPE_F32, 2, SHAPE, &a->view));
}

/* Prints like PDL: "[\n [2 2 2]\n [2 2 2]\n]". */
static void print_arr(const Arr *a) {
    printf("[\n");
    for (int r = 0; r < ROWS; r++) {
        printf(" [");
        for (int c = 0; c < COLS; c++) printf(c ? " %g" : "%g", a->data[r * COLS + c]);
        printf("]\n");
    }
    printf("]\n");
}

/* stored += recv * 3, announcing the key. Runs on an engine thread. */
static int update(int32_t key, SynkvArray *recv, SynkvArray *stored, void *user_data) {
    float *in, *out;
    (void)user_data;
    printf("update on key: %d\n", key);
    if (synkv_array_data(recv, (void **)&in) != SYNKV_OK) return 1;
    if (synkv_array_data(stored, (void **)&out) != SYNKV_OK) return 1;
    for (int i = 0; i < N; i++) out[i] += in[i] * 3;
    return 0;
}

int main(void) {
    SynkvKV *kv;
    int32_t key = 3;
    Arr init, a, two[2];

    CHECK(synkv_kv_create("local", &kv));

    /* init key 3 with ones*2, pull it back */
    arr_init(&init, 2);
    CHECK(synkv_kv_init_int(kv, 1, &key, &init.view));
    arr_init(&a, 0);
    CHECK(synkv_kv_pull_int(kv, 1, &key, NULL, &a.view, 0));
    print_arr(&a);

    /* push ones*8: the default updater assigns */
    Arr g;
    arr_init(&g, 8);
    CHECK(synkv_kv_push_int(kv, 1, &key, NULL, &g.view, 0));
    CHECK(synkv_kv_pull_int(kv, 1, &key, NULL, &a.view, 0));
    print_arr(&a);

    /* two devices push ones each: summed to 2 */
    arr_init(&two[0], 1);
    arr_init(&two[1], 1);
    SynkvArray *grads[2] = {two[0].view, two[1].view};
    uint32_t count = 2;
    CHECK(synkv_kv_push_int(kv, 1, &key, &count, grads, 0));
    CHECK(synkv_kv_pull_int(kv, 1, &key, NULL, &a.view, 0));
    print_arr(&a);

    /* an updater: stored += input * 3; push the two arrays again: 2 + 2*3 = 8 */
    CHECK(synkv_kv_set_updater(kv, update, NULL, NULL, SYNKV_UPDATER_ENGINE_THREAD));
    CHECK(synkv_kv_push_int(kv, 1, &key, &count, grads, 0));
    CHECK(synkv_kv_pull_int(kv, 1, &key, NULL, &a.view, 0));
    print_arr(&a);

    /* pull into two outputs */
    Arr b[2];
    arr_init(&b[0], 0);
    arr_init(&b[1], 0);
    SynkvArray *outs[2] = {b[0].view, b[1].view};
    CHECK(synkv_kv_pull_int(kv, 1, &key, &count, outs, 0));
    print_arr(&b[0]);
    print_arr(&b[1]);

    /* a list of keys: 5, 7, 9 initialised with ones, pushed ones: 1 + 1*3 = 4 */
    int32_t keys[3] = {5, 7, 9};
    Arr ones[3], res[3];
    SynkvArray *ones_v[3], *res_v[3];
    for (int i = 0; i < 3; i++) {
        arr_init(&ones[i], 1);
        arr_init(&res[i], 0);
        ones_v[i] = ones[i].view;
        res_v[i] = res[i].view;
    }
    CHECK(synkv_kv_init_int(kv, 3, keys, ones_v));
    CHECK(synkv_kv_push_int(kv, 3, keys, NULL, ones_v, 0));
    CHECK(synkv_kv_pull_int(kv, 3, keys, NULL, res_v, 0));
    for (int i = 0; i < 3; i++) print_arr(&res[i]);

    /* free the views first: they borrow the buffers above */
    for (int i = 0; i < 3; i++) {
        CHECK(synkv_array_free(ones[i].view));
        CHECK(synkv_array_free(res[i].view));
    }
    CHECK(synkv_array_free(init.view));
    CHECK(synkv_array_free(a.view));
    CHECK(synkv_array_free(g.view));
    CHECK(synkv_array_free(two[0].view));
    CHECK(synkv_array_free(two[1].view));
    CHECK(synkv_array_free(b[0].view));
    CHECK(synkv_array_free(b[1].view));
    CHECK(synkv_kv_free(kv));
    return 0;
}

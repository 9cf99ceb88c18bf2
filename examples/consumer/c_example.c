/* SPDX-License-Identifier: Apache-2.0
 * The C API (zinf.h) from C99: a bad config is ZINF_ERR_USAGE with the reader's message, then
 * a tiny engine on the host device: set weights, fetch and check the bf16 copy, hand in
 * gradients, step, and check Adam's first step. Exits 1 on any mismatch. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zinf.h"

#define N 777

static const char* kConfig =
    "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 32768,"
    "  \"offload_param\": {\"device\": \"cpu\", \"buffer_count\": 2, \"buffer_size\": 4096},"
    "  \"offload_optimizer\": {\"device\": \"cpu\"}},"
    " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01}}}";

static uint16_t to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static int fail(const char* what, zinf_status s) {
  fprintf(stderr, "c_example: %s: %s: %s\n", what, zinf_status_name(s), zinf_last_error());
  return 1;
}

int main(void) {
  static float w[N], g[N], after[N];
  uint16_t bf16[N];
  zinf_layer_spec layer = {"only", N, ZINF_DTYPE_BF16};
  /* The host simulation, so the fetched bytes can be read here; the default (zeroed or NULL
   * options) is ZINF_DEVICE_AUTO, a GPU where there is one. */
  zinf_engine_options options = {sizeof(zinf_engine_options), ZINF_DEVICE_HOST, 0, NULL,
                                 ZINF_STATE_PRECISION_CONFIG};
  zinf_engine* engine = NULL;
  zinf_status s;
  void* data = NULL;
  size_t bytes = 0;
  zinf_stats stats;
  int i, bad = 0;

  printf("c_example: zinf %s\n", zinf_version());
  s = zinf_engine_create("{\"zero_optimization\": {\"stagee\": 3}}", &layer, 1, NULL, &engine);
  if (s != ZINF_ERR_USAGE || engine != NULL || strstr(zinf_last_error(), "stagee") == NULL) {
    fprintf(stderr, "c_example: a bad key gave %s: '%s'\n", zinf_status_name(s), zinf_last_error());
    return 1;
  }

  s = zinf_engine_create(kConfig, &layer, 1, &options, &engine);
  if (s != ZINF_OK) return fail("create", s);
  for (i = 0; i < N; ++i) {
    w[i] = 0.002f * (float)(i % 51) - 0.05f;
    g[i] = (i % 2 == 0) ? 0.125f : -1.0f;
  }
  if ((s = zinf_engine_set_master_weights(engine, 0, w, N)) != ZINF_OK) return fail("set", s);
  if ((s = zinf_engine_fetch(engine, 0, &data, &bytes)) != ZINF_OK) return fail("fetch", s);
  if (bytes != sizeof bf16) {
    fprintf(stderr, "c_example: fetched %zu bytes, want %zu\n", bytes, sizeof bf16);
    return 1;
  }
  memcpy(bf16, data, bytes);
  if ((s = zinf_engine_release(engine, 0)) != ZINF_OK) return fail("release", s);
  for (i = 0; i < N; ++i) bad += bf16[i] != to_bf16(w[i]);

  if ((s = zinf_engine_set_gradients(engine, 0, g, N, ZINF_DTYPE_F32)) != ZINF_OK)
    return fail("set_gradients", s);
  if ((s = zinf_engine_step(engine, NULL)) != ZINF_OK) return fail("step", s);
  if ((s = zinf_engine_read_master_weights(engine, 0, after, N)) != ZINF_OK) return fail("read", s);
  for (i = 0; i < N; ++i) {
    double want = w[i] - 0.01 * (g[i] > 0 ? 1.0 : -1.0);
    bad += fabs(after[i] - want) > 1e-5;
  }
  stats.struct_size = sizeof stats; /* the fields this program knows */
  if ((s = zinf_engine_stats(engine, &stats)) != ZINF_OK) return fail("stats", s);
  zinf_engine_destroy(engine);
  if (stats.steps != 1 || bad != 0) {
    fprintf(stderr, "c_example: steps=%llu, %d mismatched elements\n",
            (unsigned long long)stats.steps, bad);
    return 1;
  }
  printf("c_example: ok\n");
  return 0;
}

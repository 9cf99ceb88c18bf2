/* SPDX-License-Identifier: Apache-2.0
 * zinf.h compiled as strict C99 (-std=c99 -Wpedantic -Werror) and called from C: the header is
 * valid C and the functions have C linkage. capi_test.cc runs zinf_capi_c_smoke. */
#include "zinf.h"

#include <stdio.h>
#include <string.h>

int zinf_capi_c_smoke(char* message, size_t capacity);

int zinf_capi_c_smoke(char* message, size_t capacity) {
  zinf_engine* engine = NULL;
  zinf_layer_spec layer = {"x", 16, ZINF_DTYPE_BF16};
  zinf_engine_options options = {sizeof(zinf_engine_options), ZINF_DEVICE_HOST, 0, NULL,
                                 ZINF_STATE_PRECISION_CONFIG};
  zinf_status status;
  /* The versions' sizes are constant expressions a C99 caller can use. */
  /* (The options' last field is an int-sized enum: the struct may end in padding.) */
  if (ZINF_ENGINE_OPTIONS_SIZE_V2 > sizeof(zinf_engine_options) ||
      ZINF_ENGINE_OPTIONS_SIZE_V1 >= ZINF_ENGINE_OPTIONS_SIZE_V2 ||
      ZINF_STATS_SIZE_V3 != sizeof(zinf_stats) || ZINF_STATS_SIZE_V1 >= ZINF_STATS_SIZE_V2 ||
      ZINF_STATS_SIZE_V2 >= ZINF_STATS_SIZE_V3) {
    snprintf(message, capacity, "the versioned sizes are not today's struct sizes");
    return 1;
  }
  if (strlen(zinf_version()) == 0) {
    snprintf(message, capacity, "empty version");
    return 1;
  }
  status = zinf_engine_create("{\"nope\": 1}", &layer, 1, &options, &engine);
  if (status != ZINF_ERR_USAGE || engine != NULL || zinf_last_error()[0] == '\0') {
    snprintf(message, capacity, "bad config gave %s: '%s'", zinf_status_name(status),
             zinf_last_error());
    return 1;
  }
  status = zinf_engine_step(NULL, NULL);
  if (status != ZINF_ERR_USAGE || strcmp(zinf_last_error(), "zinf_engine_step: engine is NULL")) {
    snprintf(message, capacity, "step(NULL) gave %s: '%s'", zinf_status_name(status),
             zinf_last_error());
    return 1;
  }
  /* The snapshot enum is C too; a NULL engine is refused before *out is written. */
  {
    zinf_save_snapshot snapshot = ZINF_SAVE_SNAPSHOT_NONE;
    status = zinf_engine_last_save_snapshot(NULL, &snapshot);
    if (status != ZINF_ERR_USAGE || snapshot != ZINF_SAVE_SNAPSHOT_NONE) {
      snprintf(message, capacity, "last_save_snapshot(NULL) gave %s", zinf_status_name(status));
      return 1;
    }
  }
  /* The multi-rank door is C too: its argument checks name it. */
  status = zinf_engine_create_mpi(NULL, &layer, 1, &options, 0, &engine);
  if (status != ZINF_ERR_USAGE || engine != NULL ||
      strcmp(zinf_last_error(), "zinf_engine_create_mpi: config is NULL")) {
    snprintf(message, capacity, "create_mpi(NULL config) gave %s: '%s'", zinf_status_name(status),
             zinf_last_error());
    return 1;
  }
  zinf_engine_destroy(NULL);
  return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 * The C API's multi-rank door (zinf_engine_create_mpi), compiled as C99 and run under mpirun
 * on 2 and 3 ranks: usage: capi_mpi_test <zinf tool> <ranks>.
 * - Stages 1, 2 and 3 fetch, before every step, the bytes one zinf_engine_create engine over the
 *   whole layers fetches when fed the ranks' averaged gradients, and end with bitwise its master
 *   weights. The gradients are small integers times 2^-12, rank r's the average plus
 *   (2r - (N - 1)) times another such value, so the average is exact in fp32 whatever the order
 *   of the sums (tests/dist/sharded_engine_checks.h does the same in C++).
 * - Each step's collective bytes (zinf_stats version 3) are what `zinf plan --params P --gpus N
 *   --gpus-per-node N --bytes-per-param 2,4,12 --json` prints for the stage: every layer a
 *   multiple of 6 elements, so neither 2 nor 3 ranks pad.
 * - A version-2 caller of zinf_engine_stats gets version 2's bytes only; a checkpoint saved at
 *   stage 2 loads at stage 3.
 * - A group of one (MPI_COMM_SELF): no collective bytes, stage 0 accepted.
 * - The errors: MPI_COMM_NULL's handle, a handle that names no communicator (Open MPI), an
 *   intercommunicator, stage 0 on several ranks, one rank's bad config (every rank fails), the ranks' models differing,
 *   save_async; each with its exact message.
 * The ranks run the plan before MPI_Init (no fork inside MPI). A failed check aborts the job. */
#define _POSIX_C_SOURCE 200809L /* popen, mkdtemp */

#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zinf.h"

static int g_rank = 0;
static int g_size = 1;

#define CHECK(cond, ...)                                                                        \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                             \
      fputc('\n', stderr);                                                                      \
      fflush(stderr);                                                                           \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                             \
    }                                                                                           \
  } while (0)

#define OK(call)                                                                             \
  do {                                                                                       \
    zinf_status ok_status_ = (call);                                                         \
    CHECK(ok_status_ == ZINF_OK, "%s: %s", zinf_status_name(ok_status_), zinf_last_error()); \
  } while (0)

/* Expects `call` to fail with `status` and exactly `text` as zinf_last_error(). */
#define FAILS(call, status, text)                                                              \
  do {                                                                                         \
    zinf_status fails_status_ = (call);                                                        \
    CHECK(fails_status_ == (status) && strcmp(zinf_last_error(), (text)) == 0,                 \
          "got %s '%s', expected %s '%s'", zinf_status_name(fails_status_), zinf_last_error(), \
          zinf_status_name(status), (text));                                                   \
  } while (0)

enum { kLayers = 3, kSteps = 3 };
/* Multiples of 6: no padding on 2 or 3 ranks. */
static const zinf_layer_spec kModel[kLayers] = {
    {"embed", 6000, ZINF_DTYPE_BF16}, {"bias", 6, ZINF_DTYPE_F16}, {"proj", 1206, ZINF_DTYPE_BF16}};

static uint64_t model_params(void) {
  uint64_t n = 0;
  int l;
  for (l = 0; l < kLayers; ++l) n += kModel[l].numel;
  return n;
}

static void config_of(int stage, char* out, size_t capacity) {
  snprintf(out, capacity,
           "{\"zero_optimization\": {\"stage\": %d,"
           " \"offload_optimizer\": {\"device\": \"cpu\"}},"
           " \"optimizer\": {\"type\": \"AdamW\","
           " \"params\": {\"lr\": 0.015625, \"weight_decay\": 0.0078125}},"
           " \"zinf\": {\"adam_threads\": 1}}",
           stage);
}

static float initial_weight(int layer, uint64_t i) {
  return (float)((int)(((uint64_t)layer * 131u + i * 17u) % 257u) - 128) / 256.0f;
}

/* The ranks' average at `step`, and rank `rank`'s gradient (the average plus its share of a
 * spread that sums to 0 over the ranks). */
static float average_grad(int layer, uint64_t i, int step) {
  return (float)((int)((i * 7u + (uint64_t)layer * 3u + (uint64_t)step) % 17u) - 8) / 4096.0f;
}
static float rank_grad(int layer, uint64_t i, int step, int rank, int world) {
  const float spread = (float)((int)((i * 5u + (uint64_t)step) % 11u) - 5) / 4096.0f;
  return average_grad(layer, i, step) + (float)(2 * rank - (world - 1)) * spread;
}

static const zinf_engine_options kHost = {sizeof(zinf_engine_options), ZINF_DEVICE_HOST, 0, NULL,
                                          ZINF_STATE_PRECISION_CONFIG};

/* The plan's per-step bytes per GPU for stages 1..3: [stage][0] all-gather, [1] gradient
 * reduction (reduce-scatter + all-reduce). */
static double g_plan[4][2];

/* The number after "key": in `row` (up to its end), or -1. */
static double json_number(const char* row, const char* end, const char* key) {
  char quoted[96];
  const char* at;
  snprintf(quoted, sizeof quoted, "\"%s\":", key);
  at = strstr(row, quoted);
  if (at == NULL || at >= end) return -1;
  return strtod(at + strlen(quoted), NULL);
}

static void read_plan(const char* tool, int world) {
  char command[1024];
  static char out[1 << 20];
  size_t length = 0;
  size_t got;
  FILE* pipe;
  const char* row;
  snprintf(command, sizeof command,
           "'%s' plan --params %llu --gpus %d --gpus-per-node %d --bytes-per-param 2,4,12 --json",
           tool, (unsigned long long)model_params(), world, world);
  pipe = popen(command, "r");
  if (pipe == NULL) {
    fprintf(stderr, "cannot run %s\n", command);
    exit(1);
  }
  while ((got = fread(out + length, 1, sizeof out - 1 - length, pipe)) > 0) length += got;
  out[length] = '\0';
  if (pclose(pipe) != 0) {
    fprintf(stderr, "%s failed:\n%s\n", command, out);
    exit(1);
  }
  /* The first row of each stage in "setups" (the collectives do not depend on the tiers). */
  row = strstr(out, "\"setups\"");
  while (row != NULL && (row = strchr(row, '{')) != NULL) {
    const char* end = strchr(row, '}');
    const double stage = json_number(row, end, "stage");
    if (end == NULL) break;
    if (stage >= 1 && stage <= 3 && g_plan[(int)stage][0] == 0) {
      g_plan[(int)stage][0] = json_number(row, end, "allgather_bytes_per_step_per_gpu");
      g_plan[(int)stage][1] = json_number(row, end, "grad_reduce_bytes_per_step_per_gpu");
    }
    row = end;
  }
  if (g_plan[1][1] <= 0 || g_plan[2][1] <= 0 || g_plan[3][1] <= 0) {
    fprintf(stderr, "no stage 1, 2 and 3 rows with collective bytes in:\n%s\n", out);
    exit(1);
  }
}

static zinf_stats stats_of(zinf_engine* e) {
  zinf_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  OK(zinf_engine_stats(e, &s));
  CHECK(s.struct_size == ZINF_STATS_SIZE_V3, "struct_size %zu", s.struct_size);
  return s;
}

static void set_weights(zinf_engine* e) {
  int l;
  for (l = 0; l < kLayers; ++l) {
    const size_t n = (size_t)kModel[l].numel;
    float* w = malloc(n * sizeof *w);
    size_t i;
    for (i = 0; i < n; ++i) w[i] = initial_weight(l, i);
    OK(zinf_engine_set_master_weights(e, (size_t)l, w, n));
    free(w);
  }
}

/* Every layer's master weights, concatenated (the caller frees). */
static float* read_weights(zinf_engine* e) {
  float* all = malloc((size_t)model_params() * sizeof *all);
  size_t at = 0;
  int l;
  for (l = 0; l < kLayers; ++l) {
    OK(zinf_engine_read_master_weights(e, (size_t)l, all + at, (size_t)kModel[l].numel));
    at += (size_t)kModel[l].numel;
  }
  return all;
}

/* One training step on the sharded engine `e` and the reference `ref` (forward: fetch and
 * compare every layer; backward: fetch again, hand in the gradients; step). */
static void train_step(zinf_engine* e, zinf_engine* ref, int step) {
  float* mines[kLayers];
  float* averages[kLayers];
  int l;
  for (l = 0; l < kLayers; ++l) {
    void* data = NULL;
    void* ref_data = NULL;
    size_t bytes = 0;
    size_t ref_bytes = 0;
    OK(zinf_engine_fetch(e, (size_t)l, &data, &bytes));
    OK(zinf_engine_fetch(ref, (size_t)l, &ref_data, &ref_bytes));
    CHECK(bytes == ref_bytes && bytes == 2 * kModel[l].numel, "layer %d: %zu bytes", l, bytes);
    CHECK(memcmp(data, ref_data, bytes) == 0, "step %d layer %d: fetched parameters differ", step,
          l);
    OK(zinf_engine_release(e, (size_t)l));
    OK(zinf_engine_release(ref, (size_t)l));
  }
  for (l = kLayers - 1; l >= 0; --l) {
    const size_t n = (size_t)kModel[l].numel;
    float* mine = malloc(n * sizeof *mine);
    float* average = malloc(n * sizeof *average);
    void* data = NULL;
    size_t bytes = 0;
    size_t i;
    for (i = 0; i < n; ++i) {
      mine[i] = rank_grad(l, i, step, g_rank, g_size);
      average[i] = average_grad(l, i, step);
    }
    OK(zinf_engine_fetch(e, (size_t)l, &data, &bytes));
    OK(zinf_engine_release(e, (size_t)l));
    /* Valid until the steps return (zinf_engine_set_gradients' contract). */
    OK(zinf_engine_set_gradients(e, (size_t)l, mine, n, ZINF_DTYPE_F32));
    OK(zinf_engine_set_gradients(ref, (size_t)l, average, n, ZINF_DTYPE_F32));
    mines[l] = mine;
    averages[l] = average;
  }
  OK(zinf_engine_step(e, NULL));
  OK(zinf_engine_step(ref, NULL));
  for (l = 0; l < kLayers; ++l) {
    free(mines[l]);
    free(averages[l]);
  }
}

/* Trains stage `stage` for kSteps steps beside a one-rank reference; checks the counters
 * against the plan and returns the final weights (the caller frees). */
static float* run_stage(int stage, zinf_engine** keep) {
  char config[1024];
  zinf_engine* e = NULL;
  zinf_engine* ref = NULL;
  float* weights;
  float* expected;
  int step;
  uint64_t first[3] = {0, 0, 0};
  config_of(stage, config, sizeof config);
  OK(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, (int)MPI_Comm_c2f(MPI_COMM_WORLD),
                            &e));
  OK(zinf_engine_create(config, kModel, kLayers, &kHost, &ref));
  {
    const zinf_stats s = stats_of(e);
    CHECK(s.zero_stage == (uint64_t)stage, "zero_stage %llu", (unsigned long long)s.zero_stage);
    CHECK(s.last_step_allgather_bytes == 0 && s.last_step_reduce_scatter_bytes == 0 &&
              s.last_step_all_reduce_bytes == 0,
          "counters before the first step");
  }
  set_weights(e);
  set_weights(ref);
  for (step = 0; step < (int)kSteps; ++step) {
    zinf_stats s;
    train_step(e, ref, step);
    s = stats_of(e);
    CHECK(s.steps == (uint64_t)step + 1, "steps %llu", (unsigned long long)s.steps);
    if (step == 0) {
      first[0] = s.last_step_allgather_bytes;
      first[1] = s.last_step_reduce_scatter_bytes;
      first[2] = s.last_step_all_reduce_bytes;
    }
    CHECK(s.last_step_allgather_bytes == first[0] && s.last_step_reduce_scatter_bytes == first[1] &&
              s.last_step_all_reduce_bytes == first[2],
          "step %d's counters differ from the first step's", step);
  }
  /* The plan's figures, exactly (no padding); stage 1 all-reduces, 2 and 3 reduce-scatter. */
  CHECK((double)first[0] == g_plan[stage][0], "stage %d: all-gather %llu, plan %.0f", stage,
        (unsigned long long)first[0], g_plan[stage][0]);
  CHECK((double)(first[1] + first[2]) == g_plan[stage][1],
        "stage %d: reduce-scatter %llu + all-reduce %llu, plan %.0f", stage,
        (unsigned long long)first[1], (unsigned long long)first[2], g_plan[stage][1]);
  CHECK(stage == 1 ? first[1] == 0 && first[2] > 0 : first[2] == 0 && first[1] > 0,
        "stage %d: the wrong gradient collective", stage);
  if (g_rank == 0) {
    printf(
        "%d ranks, stage %d: all-gather %llu, reduce-scatter %llu, all-reduce %llu bytes per "
        "step; zinf plan: all-gather %.0f, gradient reduction %.0f\n",
        g_size, stage, (unsigned long long)first[0], (unsigned long long)first[1],
        (unsigned long long)first[2], g_plan[stage][0], g_plan[stage][1]);
    fflush(stdout);
  }
  weights = read_weights(e);
  expected = read_weights(ref);
  CHECK(memcmp(weights, expected, (size_t)model_params() * sizeof(float)) == 0,
        "stage %d: the weights differ from one engine's", stage);
  free(expected);
  zinf_engine_destroy(ref);
  if (keep != NULL) {
    *keep = e;
  } else {
    zinf_engine_destroy(e);
  }
  return weights;
}

/* zinf_engine_stats for a caller built against version 2: nothing past it is written. */
static void check_v2_caller(zinf_engine* e) {
  zinf_stats v2;
  memset(&v2, 0xab, sizeof v2);
  v2.struct_size = ZINF_STATS_SIZE_V2;
  OK(zinf_engine_stats(e, &v2));
  CHECK(v2.struct_size == ZINF_STATS_SIZE_V2, "struct_size %zu", v2.struct_size);
  CHECK(v2.steps == kSteps, "steps %llu", (unsigned long long)v2.steps);
  CHECK(v2.last_step_allgather_bytes == 0xababababababababull &&
            v2.zero_stage == 0xababababababababull,
        "a version-2 caller's struct was written past its size");
}

static void check_errors(void) {
  char config[1024];
  char expected[1024];
  zinf_engine* e = NULL;
  const int null_comm = (int)MPI_Comm_c2f(MPI_COMM_NULL);
  const int world = (int)MPI_Comm_c2f(MPI_COMM_WORLD);
  config_of(3, config, sizeof config);

  snprintf(expected, sizeof expected,
           "zinf_engine_create_mpi: mpi collectives: fortran_comm %d is MPI_COMM_NULL; pass a "
           "communicator of the ranks (e.g. MPI_Comm_c2f(MPI_COMM_WORLD))",
           null_comm);
  FAILS(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, null_comm, &e), ZINF_ERR_USAGE,
        expected);
  CHECK(e == NULL, "an engine after a failure");
#ifdef OPEN_MPI
  /* Open MPI answers a handle that names no communicator with a null one (MPICH's handles are
   * checked by MPI itself, whose default error handler aborts). */
  FAILS(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, 12345, &e), ZINF_ERR_USAGE,
        "zinf_engine_create_mpi: mpi collectives: fortran_comm 12345 is not a valid "
        "communicator handle");
  CHECK(e == NULL, "an engine after a failure");
#endif

  /* An intercommunicator (rank 0's group against the others'). */
  {
    MPI_Comm half = MPI_COMM_NULL;
    MPI_Comm inter = MPI_COMM_NULL;
    const int color = g_rank == 0 ? 0 : 1;
    int handle;
    MPI_Comm_split(MPI_COMM_WORLD, color, g_rank, &half);
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, color == 0 ? 1 : 0, 42, &inter);
    handle = (int)MPI_Comm_c2f(inter);
    snprintf(expected, sizeof expected,
             "zinf_engine_create_mpi: mpi collectives: fortran_comm %d is an intercommunicator; "
             "zinf's collectives need an intracommunicator",
             handle);
    FAILS(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, handle, &e), ZINF_ERR_USAGE,
          expected);
    CHECK(e == NULL, "an engine after a failure");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
  }

  /* Stage 0 on several ranks: refused on every rank, with the same message. */
  snprintf(expected, sizeof expected,
           "ShardedEngine: zero_optimization.stage 0 on %d ranks: plain data parallelism is not "
           "offered; set zero_optimization.stage to 1 or 2 (each rank keeps 1/N of the optimizer "
           "state) or 3 (and of the parameters)",
           g_size);
  FAILS(zinf_engine_create_mpi("{\"zero_optimization\": {\"stage\": 0}}", kModel, kLayers, &kHost,
                               world, &e),
        ZINF_ERR_USAGE, expected);
  CHECK(e == NULL, "an engine after a failure");

  /* The last rank's config is malformed: it says why, every other rank that it failed. */
  if (g_rank == g_size - 1) {
    const zinf_status status = zinf_engine_create_mpi("{\"zero_optimization\": {\"stagee\": 3}}",
                                                      kModel, kLayers, &kHost, world, &e);
    CHECK(status == ZINF_ERR_USAGE && strstr(zinf_last_error(), "stagee") != NULL, "got %s '%s'",
          zinf_status_name(status), zinf_last_error());
  } else {
    snprintf(expected, sizeof expected,
             "zinf_engine_create_mpi failed: 1 of %d ranks failed (rank %d: usage); this rank "
             "(%d) did not",
             g_size, g_size - 1, g_rank);
    FAILS(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, world, &e), ZINF_ERR_USAGE,
          expected);
  }
  CHECK(e == NULL, "an engine after a failure");

  /* The last rank's stage differs: refused on every rank. */
  {
    char other[1024];
    config_of(2, other, sizeof other);
    snprintf(expected, sizeof expected,
             "zinf_engine_create_mpi: the ranks' models differ: rank 0 has "
             "zero_optimization.stage 3, 3 layers of %llu elements, rank %d "
             "zero_optimization.stage 2, 3 layers of %llu elements (every rank passes the same "
             "config and layers)",
             (unsigned long long)model_params(), g_size - 1, (unsigned long long)model_params());
    FAILS(zinf_engine_create_mpi(g_rank == g_size - 1 ? other : config, kModel, kLayers, &kHost,
                                 world, &e),
          ZINF_ERR_USAGE, expected);
    CHECK(e == NULL, "an engine after a failure");
  }

  /* A sharded engine has no asynchronous save; nothing is ever in flight. */
  OK(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, world, &e));
  FAILS(zinf_engine_save_async(e, "/tmp"), ZINF_ERR_USAGE,
        "zinf_engine_save_async: a sharded engine (zinf_engine_create_mpi) has no asynchronous "
        "save; use zinf_engine_save");
  CHECK(strcmp(zinf_engine_last_error(e), zinf_last_error()) == 0, "the engine's message");
  OK(zinf_engine_wait_save(e));
  {
    zinf_save_snapshot snapshot = ZINF_SAVE_SNAPSHOT_REFLINK;
    OK(zinf_engine_last_save_snapshot(e, &snapshot));
    CHECK(snapshot == ZINF_SAVE_SNAPSHOT_NONE, "snapshot %d", (int)snapshot);
  }
  zinf_engine_destroy(e);
}

/* A group of one (MPI_COMM_SELF on each rank at once): the plain engine's behaviour, so no
 * collective bytes, and stage 0 is accepted; the stage is reported as configured. */
static void check_group_of_one(void) {
  zinf_engine* e = NULL;
  int stage;
  for (stage = 0; stage <= 2; stage += 2) {
    char config[1024];
    zinf_stats s;
    config_of(stage, config, sizeof config);
    OK(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, (int)MPI_Comm_c2f(MPI_COMM_SELF),
                              &e));
    set_weights(e);
    {
      float* grads[kLayers];
      int l;
      for (l = 0; l < kLayers; ++l) {
        const size_t n = (size_t)kModel[l].numel;
        size_t i;
        grads[l] = malloc(n * sizeof *grads[l]);
        for (i = 0; i < n; ++i) grads[l][i] = average_grad(l, i, 0);
        OK(zinf_engine_set_gradients(e, (size_t)l, grads[l], n, ZINF_DTYPE_F32));
      }
      OK(zinf_engine_step(e, NULL));
      for (l = 0; l < kLayers; ++l) free(grads[l]);
    }
    s = stats_of(e);
    CHECK(s.steps == 1 && s.zero_stage == (uint64_t)stage && s.last_step_allgather_bytes == 0 &&
              s.last_step_reduce_scatter_bytes == 0 && s.last_step_all_reduce_bytes == 0,
          "one rank at stage %d: steps %llu, stage %llu, bytes %llu %llu %llu", stage,
          (unsigned long long)s.steps, (unsigned long long)s.zero_stage,
          (unsigned long long)s.last_step_allgather_bytes,
          (unsigned long long)s.last_step_reduce_scatter_bytes,
          (unsigned long long)s.last_step_all_reduce_bytes);
    zinf_engine_destroy(e);
  }
}

/* Stage 2's checkpoint, saved by `two` (then destroyed: a save locks its directory for the
 * engine's life), loads into a stage-3 engine with the same weights. */
static void check_checkpoint_across_stages(zinf_engine* two, const float* weights) {
  char dir[256] = "";
  char config[1024];
  zinf_engine* three = NULL;
  float* loaded;
  if (g_rank == 0) {
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/zinf-capi-mpi-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp %s", dir);
  }
  MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  OK(zinf_engine_save(two, dir));
  zinf_engine_destroy(two);
  config_of(3, config, sizeof config);
  OK(zinf_engine_create_mpi(config, kModel, kLayers, &kHost, (int)MPI_Comm_c2f(MPI_COMM_WORLD),
                            &three));
  OK(zinf_engine_load(three, dir));
  loaded = read_weights(three);
  CHECK(memcmp(loaded, weights, (size_t)model_params() * sizeof(float)) == 0,
        "stage 3 loaded other weights than stage 2 saved");
  free(loaded);
  zinf_engine_destroy(three);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    char command[512];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    CHECK(system(command) == 0, "%s", command);
  }
}

int main(int argc, char** argv) {
  float* weights[4] = {NULL, NULL, NULL, NULL};
  zinf_engine* two = NULL;
  int ranks;
  int stage;
  if (argc != 3) {
    fprintf(stderr, "usage: %s <zinf tool> <ranks>\n", argv[0]);
    return 2;
  }
  ranks = atoi(argv[2]);
  read_plan(argv[1], ranks);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  CHECK(g_size == ranks && g_size > 1, "run on %d ranks, told %d", g_size, ranks);

  check_errors();
  check_group_of_one();
  for (stage = 1; stage <= 3; ++stage) {
    weights[stage] = run_stage(stage, stage == 2 ? &two : NULL);
  }
  /* Each stage matched one engine bitwise; so they match each other. */
  CHECK(memcmp(weights[1], weights[2], (size_t)model_params() * sizeof(float)) == 0 &&
            memcmp(weights[2], weights[3], (size_t)model_params() * sizeof(float)) == 0,
        "the stages' weights differ");
  check_v2_caller(two);
  check_checkpoint_across_stages(two, weights[2]);
  for (stage = 1; stage <= 3; ++stage) free(weights[stage]);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) printf("capi_mpi_test: %d ranks: ok\n", g_size);
  MPI_Finalize();
  return 0;
}

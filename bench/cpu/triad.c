// STREAM-like triad a[i] = b[i] + s * c[i] to measure sustainable memory bandwidth.
//
//   gcc -O3 -march=native -fopenmp bench/cpu/triad.c -o triad
//   OMP_NUM_THREADS=2 ./triad [n_doubles_per_array (default 2^25)] [reps (default 10)]
//
// Prints one JSON object: {"threads", "array_mib", "reps", "best_gb_s", "avg_gb_s"}.
// Bytes counted as in STREAM: 3 arrays x 8 bytes per element (2 reads + 1 write; the
// write-allocate read is not counted). Arrays are first-touched in the same parallel
// schedule as the timed loop. Default arrays are 256 MiB each, far past any last-level cache.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : (1L << 25);
  int reps = argc > 2 ? atoi(argv[2]) : 10;
  if (n <= 0 || reps <= 0) {
    fprintf(stderr, "usage: %s [n_doubles] [reps]\n", argv[0]);
    return 2;
  }
  double* a = aligned_alloc(64, (size_t)n * sizeof(double));
  double* b = aligned_alloc(64, (size_t)n * sizeof(double));
  double* c = aligned_alloc(64, (size_t)n * sizeof(double));
  if (!a || !b || !c) {
    fprintf(stderr, "allocation failed\n");
    return 1;
  }
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {
    a[i] = 0.0;
    b[i] = 1.0 + (double)(i & 7);
    c[i] = 2.0;
  }
  const double s = 3.0;
  double best = 1e30, total = 0.0;
  for (int r = 0; r < reps + 1; ++r) {  // rep 0 is a warm-up, not counted
    double t0 = now_s();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    double dt = now_s() - t0;
    if (r == 0) continue;
    total += dt;
    if (dt < best) best = dt;
  }
  // Check the result so the loop cannot be dropped.
  double check = 0.0;
  for (long i = 0; i < n; i += 4099) check += a[i] - (b[i] + s * c[i]);
  if (check != 0.0) {
    fprintf(stderr, "triad check failed: %g\n", check);
    return 1;
  }
  const double bytes = 3.0 * sizeof(double) * (double)n;
  printf("{\"threads\": %d, \"array_mib\": %.1f, \"reps\": %d, \"best_gb_s\": %.3f, "
         "\"avg_gb_s\": %.3f}\n",
         omp_get_max_threads(), (double)n * sizeof(double) / (1024.0 * 1024.0), reps,
         bytes / best / 1e9, bytes / (total / reps) / 1e9);
  free(a);
  free(b);
  free(c);
  return 0;
}

/* The floor of one group commit on this machine's disk: a pwrite of SIZE bytes into a zero-filled file (as berth's
 * journal zeroes ahead) followed by one fdatasync, COUNT times, on the calling CPU. It prints the CPU time (user and
 * kernel, from getrusage) and the wall time per sync: what any server pays per durable write here, before doing any
 * work of its own. getrusage counts this process only; the block layer also works in kernel threads and interrupts
 * (the cache flush is issued by a kblockd worker on this CPU), so it also prints how busy this CPU and all CPUs were
 * per sync (from /proc/stat, in its clock ticks: coarse, hence the many syncs). Used by benches/group_commit.sh; not
 * part of berth.
 *   cc -O2 -o syncfloor benches/floor/syncfloor.c && taskset -c 0 ./syncfloor DIR [SIZE [COUNT]]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>

static double us(struct timeval t) { return t.tv_sec * 1e6 + t.tv_usec; }

/* Busy clock ticks (all but idle and iowait) of CPU `cpu` (-1: all CPUs), from /proc/stat. */
static long long busy_ticks(int cpu) {
  char want[32], line[512];
  if (cpu < 0) snprintf(want, sizeof want, "cpu ");
  else snprintf(want, sizeof want, "cpu%d ", cpu);
  FILE *f = fopen("/proc/stat", "r");
  long long busy = -1;
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, want, strlen(want))) continue;
    long long v[8] = {0};
    sscanf(line + strlen(want), "%lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
           &v[6], &v[7]);
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    break;
  }
  if (f) fclose(f);
  return busy;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: syncfloor DIR [SIZE [COUNT]]\n"); return 2; }
  size_t size = argc > 2 ? strtoul(argv[2], 0, 10) : 6144;
  int count = argc > 3 ? atoi(argv[3]) : 5000;
  char path[4096];
  snprintf(path, sizeof path, "%s/syncfloor.%d", argv[1], getpid());
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) { perror(path); return 1; }
  size_t total = size * (size_t)count;
  char *zeros = calloc(1, 1 << 20), *data = malloc(size);
  memset(data, 'x', size);
  for (size_t at = 0; at < total; at += 1 << 20) {
    if (pwrite(fd, zeros, 1 << 20, (off_t)at) != 1 << 20) { perror("pwrite"); return 1; }
  }
  fsync(fd);
  struct rusage r0, r1;
  struct timespec a, b;
  int cpu = sched_getcpu();
  long long cpu0 = busy_ticks(cpu), all0 = busy_ticks(-1);
  getrusage(RUSAGE_SELF, &r0);
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < count; i++) {
    if (pwrite(fd, data, size, (off_t)i * (off_t)size) != (ssize_t)size || fdatasync(fd)) { perror("sync"); return 1; }
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  getrusage(RUSAGE_SELF, &r1);
  long long cpu1 = busy_ticks(cpu), all1 = busy_ticks(-1);
  double tick = 1e6 / sysconf(_SC_CLK_TCK);
  double wall = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3;
  double user = us(r1.ru_utime) - us(r0.ru_utime), kernel = us(r1.ru_stime) - us(r0.ru_stime);
  printf("sync floor: %zu bytes per write, %d syncs: %.1f us of CPU per sync (user %.1f, kernel %.1f), %.1f us wall; "
         "CPU %d busy %.1f us per sync, all CPUs %.1f\n",
         size, count, (user + kernel) / count, user / count, kernel / count, wall / count, cpu,
         (cpu1 - cpu0) * tick / count, (all1 - all0) * tick / count);
  unlink(path);
  return 0;
}

/*
 * fsync_probe: the disk's floor under a durable commit (issue 43).
 *
 *   bench/fsync_probe [-s SECONDS] [-b BYTES] [-p MIB] DIR
 *
 * Times a write of BYTES (16384) followed by fdatasync, for SECONDS (8) in
 * each of two ways, in a file in DIR:
 *   append     the file grows by each write, so each sync also writes the
 *              file's new size and blocks (a log that is grown);
 *   overwrite  the writes go round a file of MIB (64) MiB written and synced
 *              beforehand, so a sync writes data only (a log that is reused:
 *              SQLite's WAL below journal_size_limit).
 * Prints one line a way:
 *   RESULT way=append bytes=16384 n=... per_s=... p50_ms=... p99_ms=... p999_ms=... max_ms=...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "fsync_probe: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The sample at quantile q of n sorted samples (nearest rank). */
static double at(const double *v, size_t n, double q) {
    size_t i = (size_t)(q * n);
    return v[i < n ? i : n - 1];
}

static void write_all(int fd, const char *buf, size_t len, off_t off, const char *path) {
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(fd, buf + done, len - done, off + (off_t)done);
        if (w < 0) die("pwrite", path);
        done += (size_t)w;
    }
}

/* Writes and syncs for `seconds`; `wrap` > 0 overwrites [0, wrap) round and round. */
static void probe(const char *way, const char *path, const char *buf, size_t bytes, off_t wrap, double seconds) {
    int fd = open(path, O_WRONLY | O_CREAT | (wrap ? 0 : O_TRUNC), 0600);
    if (fd < 0) die("open", path);
    size_t cap = 1 << 16, n = 0;
    double *lat = malloc(cap * sizeof *lat);
    off_t off = 0;
    double start = now_s(), end = start + seconds;
    for (double t = start; t < end;) {
        write_all(fd, buf, bytes, off, path);
        if (fdatasync(fd) != 0) die("fdatasync", path);
        double t2 = now_s();
        if (n == cap) lat = realloc(lat, (cap *= 2) * sizeof *lat);
        lat[n++] = (t2 - t) * 1e3;
        t = t2;
        off += (off_t)bytes;
        if (wrap && off + (off_t)bytes > wrap) off = 0;
    }
    double took = now_s() - start;
    close(fd);
    qsort(lat, n, sizeof *lat, cmp);
    printf("RESULT way=%s bytes=%zu n=%zu per_s=%.0f p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f\n",
           way, bytes, n, n / took, at(lat, n, 0.5), at(lat, n, 0.99), at(lat, n, 0.999), lat[n - 1]);
    fflush(stdout);
    free(lat);
}

int main(int argc, char **argv) {
    double seconds = 8;
    size_t bytes = 16384;
    long mib = 64;
    int c;
    while ((c = getopt(argc, argv, "s:b:p:")) != -1) {
        switch (c) {
        case 's': seconds = atof(optarg); break;
        case 'b': bytes = (size_t)atol(optarg); break;
        case 'p': mib = atol(optarg); break;
        default: goto usage;
        }
    }
    if (optind != argc - 1 || bytes == 0 || mib <= 0) {
    usage:
        fprintf(stderr, "usage: fsync_probe [-s SECONDS] [-b BYTES] [-p MIB] DIR\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/fsync_probe.%d", argv[optind], (int)getpid());
    char *buf = malloc(bytes);
    memset(buf, 'x', bytes);

    probe("append", path, buf, bytes, 0, seconds);

    /* Written and synced whole first, so that no overwrite allocates a block. */
    off_t wrap = (off_t)mib << 20;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die("open", path);
    for (off_t off = 0; off + (off_t)bytes <= wrap; off += (off_t)bytes) write_all(fd, buf, bytes, off, path);
    if (fsync(fd) != 0) die("fsync", path);
    close(fd);
    probe("overwrite", path, buf, bytes, wrap, seconds);

    unlink(path);
    free(buf);
    return 0;
}

/*
 * pack.c: Open MPI's MPI_Pack/MPI_Unpack on the layouts of
 * convertor/bench_test.go, for comparison with gompi's convertor.
 *
 *   column      column 17 of a 4096x4096 row-major double matrix:
 *               MPI_Type_vector(4096, 1, 4096, MPI_DOUBLE)
 *   halo-west   1020x2 strip at (2,2) of a 1024x1024 double grid with a
 *               2-wide ghost layer: MPI_Type_create_subarray, C order
 *   halo-north  2x1020 strip at (2,2) of the same grid
 *   contig      4 MiB of MPI_BYTE (and memcpy of 4 MiB for reference)
 *
 * Timing follows Go's testing.B: after a warm-up, the iteration count grows
 * until one timed run lasts at least the bench time (1 s), and that run's
 * time per iteration is printed as ns/op.
 *
 * Build and run: bench/packc/run.sh
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COLN 4096
#define COLIDX 17
#define HALON 1024
#define HALOW 2
#define CONTIG (4 << 20)

/* alloc returns page-aligned memory, as Go gives its large allocations, so
 * that copies run at the same relative alignments as in the Go benchmarks
 * (memmove speed depends on them). */
static void *alloc(size_t n)
{
    void *p;
    if (posix_memalign(&p, 4096, n) != 0) {
        perror("posix_memalign");
        exit(1);
    }
    return p;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

enum op { PACK, UNPACK, MEMCPY };

struct job {
    enum op op;
    void *mem;          /* user memory (origin of element 0) */
    MPI_Datatype type;
    void *packed;       /* packed buffer */
    int size;           /* packed bytes */
};

static void run(const struct job *j, long n)
{
    for (long i = 0; i < n; i++) {
        int pos = 0;
        switch (j->op) {
        case PACK:
            MPI_Pack(j->mem, 1, j->type, j->packed, j->size, &pos, MPI_COMM_SELF);
            break;
        case UNPACK:
            MPI_Unpack(j->packed, j->size, &pos, j->mem, 1, j->type, MPI_COMM_SELF);
            break;
        case MEMCPY:
            memcpy(j->packed, j->mem, (size_t)j->size);
            break;
        }
    }
    /* keep the compiler from discarding the copies */
    __asm__ volatile("" : : "r"(j->packed), "r"(j->mem) : "memory");
}

/* bench returns ns per iteration, grown like Go's b.Loop to a 1 s run. */
static double bench(const struct job *j)
{
    const double target = 1e9;
    long n = 1;
    run(j, 1); /* warm-up */
    for (;;) {
        double t0 = now_ns();
        run(j, n);
        double dt = now_ns() - t0;
        if (dt >= target || n >= 1000000000L)
            return dt / (double)n;
        long next = dt > 0 ? (long)((double)n * target * 1.2 / dt) : n * 100;
        if (next > n * 100)
            next = n * 100;
        if (next <= n)
            next = n + 1;
        n = next;
    }
}

static void report(const char *layout, const char *op, const struct job *j)
{
    double ns = bench(j);
    printf("layout=%-10s op=%-6s bytes=%-8d ns/op=%.0f MB/s=%.0f\n", layout, op, j->size, ns,
           (double)j->size / ns * 1e3);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);

    /* column */
    double *m = alloc(sizeof(double) * COLN * COLN);
    for (long i = 0; i < (long)COLN * COLN; i++)
        m[i] = (double)i;
    MPI_Datatype col;
    MPI_Type_vector(COLN, 1, COLN, MPI_DOUBLE, &col);
    MPI_Type_commit(&col);
    double *colbuf = alloc(sizeof(double) * COLN);
    struct job j = {PACK, m + COLIDX, col, colbuf, COLN * 8};
    report("column", "pack", &j);
    j.op = UNPACK;
    report("column", "unpack", &j);

    /* halo faces */
    double *g = alloc(sizeof(double) * HALON * HALON);
    for (long i = 0; i < (long)HALON * HALON; i++)
        g[i] = (double)i;
    int sizes[2] = {HALON, HALON}, starts[2] = {HALOW, HALOW};
    struct {
        const char *name;
        int sub[2];
    } sides[2] = {{"halo-west", {HALON - 2 * HALOW, HALOW}}, {"halo-north", {HALOW, HALON - 2 * HALOW}}};
    for (int s = 0; s < 2; s++) {
        MPI_Datatype t;
        MPI_Type_create_subarray(2, sizes, sides[s].sub, starts, MPI_ORDER_C, MPI_DOUBLE, &t);
        MPI_Type_commit(&t);
        int size;
        MPI_Type_size(t, &size);
        void *buf = alloc(size);
        struct job h = {PACK, g, t, buf, size};
        report(sides[s].name, "pack", &h);
        h.op = UNPACK;
        report(sides[s].name, "unpack", &h);
        MPI_Type_free(&t);
        free(buf);
    }

    /* contiguous */
    char *src = alloc(CONTIG), *dst = alloc(CONTIG);
    memset(src, 1, CONTIG);
    memset(dst, 2, CONTIG);
    struct job c = {PACK, src, MPI_BYTE, dst, CONTIG};
    MPI_Datatype contig;
    MPI_Type_contiguous(CONTIG, MPI_BYTE, &contig);
    MPI_Type_commit(&contig);
    c.type = contig;
    report("contig", "pack", &c);
    c.op = UNPACK;
    report("contig", "unpack", &c);
    c.op = MEMCPY;
    report("contig", "memcpy", &c);

    MPI_Type_free(&col);
    MPI_Type_free(&contig);
    free(m);
    free(colbuf);
    free(g);
    free(src);
    free(dst);
    MPI_Finalize();
    return 0;
}

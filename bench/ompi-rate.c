/*
 * ompi-rate.c - message rate with the definition of `gompi-bench rate`, for
 * Open MPI (or any MPI) on the same machine: rank 0 posts a window of 64
 * MPI_Isend of SIZE bytes + MPI_Waitall, rank 1 64 MPI_Irecv + MPI_Waitall
 * and then sends a 4-byte ack; 1000 windows per batch (as gompi-bench for
 * small sizes), one warm-up batch, the median of 21 batches is printed as
 * "size,msgs_per_s" lines (the CSV of gompi-bench --csv).
 *
 *   mpicc.openmpi -O2 -o ompi-rate bench/ompi-rate.c
 *   mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader ./ompi-rate 8 512 4096
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64
#define NBATCH 21

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* gompi-bench: loops = min(1000, max(10, min(1000, max(2, 64 MiB / (64 * size))))) */
static int loops_for(long size)
{
    long n = (64L << 20) / (WINDOW * (size > 0 ? size : 1));
    if (n > 1000) n = 1000;
    if (n < 2) n = 2;
    if (n < 10) n = 10;
    return (int)n;
}

static double batch(int rank, char *buf, int size, int loops)
{
    MPI_Request req[WINDOW];
    int ack = 0;
    MPI_Sendrecv(&ack, 0, MPI_INT, 1 - rank, 2, &ack, 0, MPI_INT, 1 - rank, 2,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    double t0 = MPI_Wtime();
    for (int l = 0; l < loops; l++) {
        for (int w = 0; w < WINDOW; w++) {
            if (rank == 0)
                MPI_Isend(buf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, &req[w]);
            else
                MPI_Irecv(buf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, &req[w]);
        }
        MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
        if (rank == 0)
            MPI_Recv(&ack, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else
            MPI_Send(&ack, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
    }
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char *buf = calloc(1, 4 << 20);
    if (rank == 0) printf("size,msgs_per_s\n");
    for (int a = 1; a < argc; a++) {
        int size = atoi(argv[a]);
        int loops = loops_for(size);
        double v[NBATCH];
        batch(rank, buf, size, loops);
        for (int b = 0; b < NBATCH; b++)
            v[b] = (double)WINDOW * loops / batch(rank, buf, size, loops);
        qsort(v, NBATCH, sizeof v[0], cmp);
        if (rank == 0) { printf("%d,%.3f\n", size, v[NBATCH / 2]); fflush(stdout); }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}

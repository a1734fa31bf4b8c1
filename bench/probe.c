/* probe.c - bench/probe in C for an MPI library: a blocking ping-pong
 * between 2 ranks whose receiver learns the size from a probe (Probe and
 * Recv, or Mprobe and Mrecv), or receives from MPI_ANY_SOURCE with
 * MPI_ANY_TAG. Rank 0 prints half the round trip.
 *
 *   mpirun -np 2 ./probe ITERS SIZE probe|mprobe|any
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void receive(const char *mode, char *in, int size, int peer)
{
    MPI_Status st;
    int n;
    if (strcmp(mode, "probe") == 0) {
        MPI_Probe(peer, 1, MPI_COMM_WORLD, &st);
        MPI_Get_count(&st, MPI_BYTE, &n);
        MPI_Recv(in, n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (strcmp(mode, "mprobe") == 0) {
        MPI_Message m;
        MPI_Mprobe(peer, 1, MPI_COMM_WORLD, &m, &st);
        MPI_Get_count(&st, MPI_BYTE, &n);
        MPI_Mrecv(in, n, MPI_BYTE, &m, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(in, size, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int iters = argc > 1 ? atoi(argv[1]) : 200000, size = argc > 2 ? atoi(argv[2]) : 8;
    const char *mode = argc > 3 ? argv[3] : "probe";
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int peer = 1 - rank;
    char *out = calloc(size + 1, 1), *in = calloc(size + 1, 1);
    double start = 0;
    /* 20000 round trips not timed, as bench/probe does. */
    for (int i = -20000; i < iters; i++) {
        if (i == 0)
            start = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(out, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            receive(mode, in, size, peer);
        } else {
            receive(mode, in, size, peer);
            MPI_Send(out, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        }
    }
    if (rank == 0)
        printf("%s %d B: %.3f us\n", mode, size, (MPI_Wtime() - start) / iters / 2 * 1e6);
    free(out);
    free(in);
    MPI_Finalize();
    return 0;
}

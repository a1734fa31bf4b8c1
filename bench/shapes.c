/* shapes.c - bench/shapes in C for an MPI library, between 2 ranks: a
 * blocking ping-pong whose receiver learns the size from a probe (Probe
 * and Recv, or Mprobe and Mrecv), receives from MPI_ANY_SOURCE with
 * MPI_ANY_TAG, polls an Irecv with MPI_Test or waits with MPI_Waitany, or
 * whose sends are MPI_Ssend; or a loop of MPI_Barrier.
 * Rank 0 prints half the round trip (the whole call for barrier).
 *
 *   mpirun -np 2 ./shapes ITERS SIZE probe|mprobe|any|test|waitany|ssend|barrier
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
    } else if (strcmp(mode, "any") == 0) {
        MPI_Recv(in, size, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (strcmp(mode, "test") == 0) {
        MPI_Request r;
        int done = 0;
        MPI_Irecv(in, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &r);
        while (!done)
            MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    } else if (strcmp(mode, "waitany") == 0) {
        MPI_Request r;
        int idx;
        MPI_Irecv(in, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &r);
        MPI_Waitany(1, &r, &idx, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(in, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
}

static void send(const char *mode, char *out, int size, int peer)
{
    if (strcmp(mode, "ssend") == 0)
        MPI_Ssend(out, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
    else
        MPI_Send(out, size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int iters = argc > 1 ? atoi(argv[1]) : 200000, size = argc > 2 ? atoi(argv[2]) : 8;
    const char *mode = argc > 3 ? argv[3] : "probe";
    int barrier = strcmp(mode, "barrier") == 0;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int peer = 1 - rank;
    char *out = calloc(size + 1, 1), *in = calloc(size + 1, 1);
    double start = 0;
    /* 20000 steps not timed, as bench/shapes does. */
    for (int i = -20000; i < iters; i++) {
        if (i == 0)
            start = MPI_Wtime();
        if (barrier) {
            MPI_Barrier(MPI_COMM_WORLD);
        } else if (rank == 0) {
            send(mode, out, size, peer);
            receive(mode, in, size, peer);
        } else {
            receive(mode, in, size, peer);
            send(mode, out, size, peer);
        }
    }
    double us = (MPI_Wtime() - start) / iters * 1e6;
    if (rank == 0)
        printf("%s %d B: %.3f us\n", mode, size, barrier ? us : us / 2);
    free(out);
    free(in);
    MPI_Finalize();
    return 0;
}

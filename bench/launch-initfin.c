/* initfin.c - MPI_Init and MPI_Finalize only: the Open MPI side of bench/launch.sh. */
#include <mpi.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Finalize();
    return 0;
}

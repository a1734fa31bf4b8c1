package mpi_test

import (
	"errors"
	"os"
	"testing"

	"github.com/gompi-org/gompi/mpi"
	"github.com/stretchr/testify/require"
)

// A program started without gorun is a singleton job: Init gives a world
// of size 1 where a rank can message itself; Finalize completes a send
// still pending; afterwards Init and Finalize fail with ErrNotInit, and
// the old world communicator refuses new work instead of hanging.
// (Init/Finalize are process-wide, so this is the package's only test of
// them; the multi-process cases run through gorun in tests/.)
// initFinalized: TestInitFinalizeSingleton has finalized this process.
var initFinalized bool

func TestInitFinalizeSingleton(t *testing.T) {
	for _, v := range []string{"GOMPI_STORE", "GOMPI_RANK", "GOMPI_SIZE", "GOMPI_SECRET"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Setenv(v, "")
			os.Unsetenv(v)
		}
	}
	if initFinalized {
		// A repeated run (go test -count=N) in the same process: the
		// process finalized already, and MPI allows one Init per process.
		_, err := mpi.Init()
		require.ErrorIs(t, err, mpi.ErrNotInit, "Init after Finalize")
		require.ErrorIs(t, mpi.Finalize(), mpi.ErrNotInit, "Finalize twice")
		return
	}
	require.ErrorIs(t, mpi.Finalize(), mpi.ErrNotInit, "Finalize before Init")

	w, err := mpi.Init()
	require.NoError(t, err)
	require.Equal(t, 0, w.Rank())
	require.Equal(t, 1, w.Size())
	_, err = mpi.Init()
	require.Error(t, err, "Init twice")

	// To itself, eager and rendezvous.
	for _, n := range []int{8, 1 << 20} {
		out := make([]byte, n)
		for i := range out {
			out[i] = byte(i*7 + n)
		}
		r, err := w.Irecv(make([]byte, n), 0, 3)
		require.NoError(t, err)
		require.NoError(t, w.Send(out, 0, 3))
		st, err := r.Wait()
		require.NoError(t, err)
		require.Equal(t, n, st.Count)
	}
	require.ErrorIs(t, w.Send([]byte{1}, 1, 0), mpi.ErrRank)

	// A send whose receive is posted late: Finalize waits for it.
	big := make([]byte, 4<<20)
	big[len(big)-1] = 42
	s, err := w.Isend(big, 0, 9)
	require.NoError(t, err)
	got := make([]byte, len(big))
	r, err := w.Irecv(got, 0, 9)
	require.NoError(t, err)
	require.NoError(t, mpi.Finalize())
	initFinalized = true
	_, err = s.Wait()
	require.NoError(t, err)
	_, err = r.Wait()
	require.NoError(t, err)
	require.Equal(t, byte(42), got[len(got)-1])

	_, err = mpi.Init()
	require.ErrorIs(t, err, mpi.ErrNotInit, "Init after Finalize")
	require.ErrorIs(t, mpi.Finalize(), mpi.ErrNotInit, "Finalize twice")
	err = w.Send([]byte{1}, 0, 0)
	require.Error(t, err, "a send on the world after Finalize")
	require.True(t, errors.Is(err, mpi.ErrNotInit) || errors.Is(err, mpi.ErrComm), "got %v", err)
}

package mpi_test

import (
	"bytes"
	"testing"

	"github.com/gompi-org/gompi/mpi"
	"github.com/stretchr/testify/require"
)

func TestSmokeSizes(t *testing.T) {
	for _, force := range []string{"", "eager", "rdma_put", "rdma_get", "send_pipeline", "rdma_pipeline"} {
		err := mpi.Run(2, func(w *mpi.Comm) error {
			for _, n := range []int{0, 1, 8, 255, 256, 257, 1000, 1024, 4096, 16 << 10, 100000, 1 << 20} {
				buf := make([]byte, n)
				if w.Rank() == 0 {
					for i := range buf {
						buf[i] = byte(i*7 + n)
					}
					if err := w.Send(buf, 1, n%100); err != nil {
						return err
					}
				} else {
					st, err := w.Recv(buf, 0, n%100)
					if err != nil {
						return err
					}
					want := make([]byte, n)
					for i := range want {
						want[i] = byte(i*7 + n)
					}
					if st.Count != n || !bytes.Equal(buf, want) {
						t.Errorf("force=%q n=%d: count %d, bytes differ", force, n, st.Count)
					}
				}
			}
			return nil
		}, mpi.WithParam("pml_force_protocol", force), mpi.WithParam("btl_self_rdma_pipeline_frag_size", "64k"), mpi.WithParam("btl_self_rdma_pipeline_send_length", "128k"))
		require.NoError(t, err, force)
	}
}

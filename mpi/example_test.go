package mpi_test

import (
	"fmt"
	"log"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

// Run starts ranks as goroutines of this process; each calls the body
// with its world communicator. Here every rank sends its number to rank 0.
func ExampleRun() {
	err := mpi.Run(4, func(world *mpi.Comm) error {
		if world.Rank() != 0 {
			return world.Send([]int64{int64(world.Rank() * 10)}, 0, 0)
		}
		sum := int64(0)
		for range world.Size() - 1 {
			v := make([]int64, 1)
			if _, err := world.Recv(v, mpi.AnySource, 0); err != nil {
				return err
			}
			sum += v[0]
		}
		fmt.Println("ranks:", world.Size(), "sum:", sum)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: ranks: 4 sum: 60
}

// Send and Recv move a slice between two ranks; the Status tells who sent
// it, with which tag and how many bytes.
func ExampleComm_Send() {
	err := mpi.Run(2, func(world *mpi.Comm) error {
		if world.Rank() == 0 {
			return world.Send([]float64{1.5, 2.5, 3.5}, 1, 7)
		}
		buf := make([]float64, 8)
		st, err := world.Recv(buf, 0, mpi.AnyTag)
		if err != nil {
			return err
		}
		n := st.Elements(convertor.Float64)
		fmt.Printf("from %d tag %d: %d bytes = %v\n", st.Source, st.Tag, st.Count, buf[:n])
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: from 0 tag 7: 24 bytes = [1.5 2.5 3.5]
}

// Isend and Irecv start transfers that Wait (or Waitall) completes; the
// buffers belong to the library until then. Here ranks pass values
// around a ring without deadlock.
func ExampleComm_Isend() {
	const n = 3
	got := make([]int32, n)
	err := mpi.Run(n, func(world *mpi.Comm) error {
		me := world.Rank()
		right, left := (me+1)%n, (me+n-1)%n
		in := make([]int32, 1)
		rr, err := world.Irecv(in, left, 0)
		if err != nil {
			return err
		}
		sr, err := world.Isend([]int32{int32(100 + me)}, right, 0)
		if err != nil {
			return err
		}
		if _, err := mpi.Waitall([]*mpi.Request{rr, sr}); err != nil {
			return err
		}
		got[me] = in[0] // each rank writes its own element
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(got)
	// Output: [102 100 101]
}

// SendInit and RecvInit fix a send's and a receive's arguments once;
// each iteration then starts them and waits, as a halo exchange loop does.
// Every round sends what the buffer holds at Start.
func ExampleComm_SendInit() {
	const n, steps = 3, 4
	sums := make([]int64, n)
	err := mpi.Run(n, func(world *mpi.Comm) error {
		me := world.Rank()
		right, left := (me+1)%n, (me+n-1)%n
		out, in := make([]int64, 1), make([]int64, 1)
		send, err := world.SendInit(out, right, 0)
		if err != nil {
			return err
		}
		recv, err := world.RecvInit(in, left, 0)
		if err != nil {
			return err
		}
		ps := []*mpi.Persistent{recv, send}
		for step := range steps {
			out[0] = int64(10*me + step)
			if err := mpi.Startall(ps); err != nil {
				return err
			}
			if _, err := mpi.Waitall([]*mpi.Request{recv.Request(), send.Request()}); err != nil {
				return err
			}
			sums[me] += in[0]
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sums) // rank r adds 10*left + 0+1+2+3
	// Output: [86 6 46]
}

// Typed lays a derived datatype over a slice: here one column of a
// row-major 3×4 matrix, received into a contiguous slice.
func ExampleTyped() {
	const rows, cols = 3, 4
	column, err := convertor.Vector(rows, 1, cols, convertor.Float64) // rows blocks of 1, cols apart
	if err != nil {
		log.Fatal(err)
	}
	if column, err = column.Commit(); err != nil {
		log.Fatal(err)
	}
	err = mpi.Run(2, func(world *mpi.Comm) error {
		if world.Rank() == 0 {
			m := []float64{
				0, 1, 2, 3,
				10, 11, 12, 13,
				20, 21, 22, 23,
			}
			return world.Send(mpi.Typed(m[2:], 1, column), 1, 0) // column 2
		}
		col := make([]float64, rows)
		if _, err := world.Recv(col, 0, 0); err != nil {
			return err
		}
		fmt.Println("column 2:", col)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: column 2: [2 12 22]
}

// Command wireup simulates the start of a large job in one process: N
// goroutine ranks wire up through a PMI server (launcher/pmi/pmitest, the
// protocol hydra and Slurm speak) and then match messages over an
// in-memory transport (btl/fake, inline), to measure how wire-up time and
// memory grow with the job, and what a peer costs.
//
//	go run ./bench/wireup -n 1024,4096
//
// Per size it prints:
//   - wire-up: every rank joins (rank 0's job id and secret, the first
//     fence), publishes a 64-byte address, fences, and reads the addresses
//     of the two peers it talks to (lazily: a rank reads a peer's address
//     only when it first needs it, as tcp does); time and heap per rank;
//   - matching: one pml engine per rank with endpoints to its two ring
//     neighbours only (lazy), then every rank sends 8 bytes to both
//     neighbours and receives two messages from any source; time and heap
//     per rank;
//   - peers: with -eager-max M, for sizes up to M, the same with an endpoint
//     to every rank (as mpi.Init's connect makes them), giving the heap per
//     peer (pml peer and the transport's endpoint).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/fake"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/launcher/pmi"
	"github.com/gompi-org/gompi/launcher/pmi/pmitest"
	"github.com/gompi-org/gompi/pml"
)

func main() {
	sizes := flag.String("n", "1024,4096", "job sizes")
	eagerMax := flag.Int("eager-max", 1024, "largest size for which every rank also gets an endpoint to every peer")
	flag.Parse()
	fmt.Printf("GOMAXPROCS %d, %s\n", runtime.GOMAXPROCS(0), runtime.Version())
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 {
			fmt.Fprintln(os.Stderr, "wireup: bad size", s)
			os.Exit(2)
		}
		if err := run(n, n <= *eagerMax); err != nil {
			fmt.Fprintln(os.Stderr, "wireup:", err)
			os.Exit(1)
		}
	}
}

// heap returns the live heap after a collection.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func run(n int, eager bool) error {
	base := heap()
	t0 := time.Now()
	jobs, srv, err := wireUp(n)
	if err != nil {
		return err
	}
	wire := time.Since(t0)
	afterWire := heap()
	fmt.Printf("n=%d wire-up: %v (%.1f us/rank), heap %.1f MiB (%.0f B/rank, PMI server's key-value space included)\n",
		n, wire.Round(time.Millisecond), float64(wire.Microseconds())/float64(n),
		float64(afterWire-base)/(1<<20), float64(afterWire-base)/float64(n))
	for _, j := range jobs {
		j.Close()
	}
	srv.Close()
	jobs = nil

	base = heap()
	t0 = time.Now()
	w, err := newWorld(n, false)
	if err != nil {
		return err
	}
	setup := time.Since(t0)
	t0 = time.Now()
	if err := w.ring(); err != nil {
		return err
	}
	match := time.Since(t0)
	lazyHeap := heap() - base
	fmt.Printf("n=%d matching (endpoints to 2 peers per rank): engines %v, ring exchange %v (%.1f us/rank), heap %.1f MiB (%.0f B/rank)\n",
		n, setup.Round(time.Millisecond), match.Round(time.Millisecond), float64(match.Microseconds())/float64(n),
		float64(lazyHeap)/(1<<20), float64(lazyHeap)/float64(n))
	w.close()
	w = nil
	if !eager {
		return nil
	}
	base = heap()
	t0 = time.Now()
	w, err = newWorld(n, true)
	if err != nil {
		return err
	}
	setup = time.Since(t0)
	eagerHeap := heap() - base
	peers := float64(n) * float64(n-3)
	fmt.Printf("n=%d endpoints to every peer: setup %v, heap %.1f MiB: %.0f B per peer beyond the lazy world\n",
		n, setup.Round(time.Millisecond), float64(eagerHeap)/(1<<20), (float64(eagerHeap)-float64(lazyHeap))/peers)
	w.close()
	return nil
}

// wireUp joins n ranks through a fake PMI server, 16 ranks per node.
func wireUp(n int) ([]*pmi.Job, *pmitest.Server, error) {
	srv := pmitest.NewServer(n)
	srv.Mapping = fmt.Sprintf("(vector,(0,%d,16))", (n+15)/16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	jobs := make([]*pmi.Job, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				c, err := pmi.New(ctx, srv.Conn(r), false, false, srv.Env(r))
				if err != nil {
					return err
				}
				j, err := pmi.NewJob(ctx, c, srv.Env(r), os.Hostname)
				if err != nil {
					return err
				}
				jobs[r] = j
				addr := make([]byte, 64)
				addr[0] = byte(r)
				if err := j.Store.Set("btl.fake."+strconv.Itoa(r), addr); err != nil {
					return err
				}
				if err := j.Fence(ctx, "wireup"); err != nil {
					return err
				}
				for _, p := range []int{(r + 1) % n, (r + n - 1) % n} {
					b, err := j.Store.Get(ctx, "btl.fake."+strconv.Itoa(p))
					if err != nil {
						return err
					}
					if len(b) != 64 || b[0] != byte(p) {
						return fmt.Errorf("rank %d read a wrong address for rank %d", r, p)
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return nil, nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return jobs, srv, nil
}

// world is n pml engines over one inline fake network.
type world struct {
	net   *fake.Network
	eng   []*pml.Engine
	comm  []*pml.Comm
	group []int
}

func newWorld(n int, everyPeer bool) (*world, error) {
	ps, err := params.NewSet(nil)
	if err != nil {
		return nil, err
	}
	w := &world{net: fake.NewNetwork(), group: make([]int, n)}
	w.net.SetInline(true)
	for i := range w.group {
		w.group[i] = i
	}
	cfg := fake.DefaultConfig()
	for r := range n {
		d := &btl.Dispatcher{}
		e, err := pml.New(pml.Config{Rank: r, Size: n, Params: ps, Dispatch: d})
		if err != nil {
			return nil, err
		}
		w.net.Attach(r, d, cfg)
		w.eng = append(w.eng, e)
	}
	for r := range n {
		peers := []int{r, (r + 1) % n, (r + n - 1) % n}
		if everyPeer {
			peers = w.group
		}
		for _, p := range peers {
			ep, err := w.net.Module(r).AddProc(p)
			if err != nil {
				return nil, err
			}
			if err := w.eng[r].SetPeer(p, ep); err != nil {
				return nil, err
			}
		}
		c, err := w.eng[r].NewComm(0, r, w.group)
		if err != nil {
			return nil, err
		}
		w.comm = append(w.comm, c)
	}
	return w, nil
}

// ring: every rank posts two any-source receives, sends 8 bytes to each
// neighbour, and waits for all four requests.
func (w *world) ring() error {
	n := len(w.eng)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				var reqs []*pml.Handle
				for range 2 {
					q, err := w.comm[r].IrecvHandle(pml.Buffer{Bytes: make([]byte, 8)}, pml.AnySource, 7)
					if err != nil {
						return err
					}
					reqs = append(reqs, q)
				}
				for _, p := range []int{(r + 1) % n, (r + n - 1) % n} {
					q, err := w.comm[r].IsendHandle(pml.Buffer{Bytes: []byte("8 bytes!")}, p, 7, pml.Standard, nil)
					if err != nil {
						return err
					}
					reqs = append(reqs, q)
				}
				for _, q := range reqs {
					if _, err := q.Wait(ctx); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

func (w *world) close() {
	for _, e := range w.eng {
		e.Close(nil)
	}
}

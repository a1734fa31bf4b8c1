package pmi

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/gompi-org/gompi/launcher/store"
)

// PMI makes a put visible only at the next fence, which every rank must
// join: fine for addresses that transports publish while they open, but
// not for exchanges between two ranks later on (verbs publishes a queue
// pair's address for one peer when it first talks to it, and waits for the
// peer's). For those, rank 0 serves a gorun store (package launcher/store)
// for the job, and hands its addresses out with the job id and secret over
// the key-value space; a rank connects to it only when it first needs it.

// keyLive is where rank 0 publishes its store's addresses.
const keyLive = "gompi.live"

// startLive starts rank 0's store and returns it with its addresses.
func startLive(secret []byte, size int) (*store.Server, []string, error) {
	srv, err := store.NewServerOn(secret, size, ":0")
	if err != nil {
		return nil, nil, err
	}
	srv.SetLogger(log.New(os.Stderr, "gompi: rank 0's wire-up store: ", 0))
	go func() {
		for range srv.Events() { // the launcher's notices: not needed here
		}
	}()
	addrs, err := store.ReachableAddrs(srv.Addr())
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	return srv, addrs, nil
}

// live is a rank's lazily made connection to rank 0's store.
type live struct {
	addrs  []string
	secret []byte
	rank   int

	mu  sync.Mutex // guards c, err
	c   *store.Client
	err error
}

// client connects on first use; a failure is kept and returned again.
func (l *live) client(ctx context.Context) (*store.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil || l.err != nil {
		return l.c, l.err
	}
	if len(l.addrs) == 0 {
		l.err = fmt.Errorf("pmi: rank 0 published no store address")
		return nil, l.err
	}
	var errs []string
	for _, a := range l.addrs {
		c, err := store.Dial(ctx, a, l.secret, l.rank)
		if err == nil {
			l.c = c
			return c, nil
		}
		errs = append(errs, err.Error())
		if ctx.Err() != nil {
			return nil, err // not kept: a later call may have more time
		}
	}
	l.err = fmt.Errorf("pmi: rank 0's wire-up store is not reachable: %s", strings.Join(errs, "; "))
	return nil, l.err
}

func (l *live) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		l.c.Close()
	}
}

// Package btltest is a conformance suite for btl.Module implementations
// and the fakes it needs.
//
// A transport's test builds n connected modules (one per world rank, each
// with its own btl.Env and Dispatcher, sharing one NewStore and JobID:
// Env makes such an Env, Open opens a component with it) and hands the
// suite a constructor:
//
//	func TestConformance(t *testing.T) {
//		btltest.Run(t, func(t *testing.T, n int) []btltest.Peer { ... })
//	}
//
// The suite registers its own handlers on the Dispatchers, so the
// constructor must not register tags 0x41-0x42 nor a failure handler.
package btltest

import (
	"context"
	"sync"

	"github.com/gompi-org/gompi/btl"
)

// Store is an in-memory btl.Store: the wire-up store of one test job.
type Store struct {
	mu      sync.Mutex
	m       map[string][]byte // guarded by mu
	changed chan struct{}     // guarded by mu; closed and replaced by every Set
}

var _ btl.Store = (*Store)(nil)

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{m: map[string][]byte{}, changed: make(chan struct{})}
}

// Set stores a copy of value under key, replacing any previous value, and
// wakes the Gets waiting for it.
func (s *Store) Set(key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = append([]byte(nil), value...)
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// Get returns a copy of the value of key, waiting until it is set or ctx
// ends (then it returns ctx's error).
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		s.mu.Lock()
		v, ok := s.m[key]
		ch := s.changed
		s.mu.Unlock()
		if ok {
			return append([]byte(nil), v...), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

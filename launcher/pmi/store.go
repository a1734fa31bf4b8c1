package pmi

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNotFound: no rank published the key, before the wire-up fence or
// (through rank 0's store) after it while the caller waited.
var ErrNotFound = errors.New("pmi: key not published by any rank")

// Store is the wire-up store of a job started by a PMI process manager:
// the btl.Store that transports publish their addresses in.
//
// Before the job's wire-up fence (Job.Fence), Set is a PMI put. Get waits
// for that fence; then a key of a shape this rank published before the
// fence (its digits aside: "btl.tcp.3" is of the shape of "btl.tcp.0") is
// a PMI get, and one that no rank published is ErrNotFound at once: the
// addresses transports publish while they open are read straight from the
// process manager. Other keys are those of exchanges between two ranks
// after the fence (verbs' queue pairs): their Set and Get go to rank 0's
// store (see live.go), where Get waits until the key appears or ctx ends
// (then an error wrapping ErrNotFound). The process manager's connection
// is thus idle once the transports are up: hydra does not cope with a
// rank that dies while a PMI request of its is in flight.
//
// Values are any bytes: in PMI they travel base64url encoded, split over
// several keys when longer than the server's value limit; keys that PMI
// cannot carry (too long, other characters) travel as a hash.
type Store struct {
	c      *Client
	live   *live         // rank 0's store; nil when there is none (tests)
	fenced chan struct{} // closed by the first successful fence

	mu     sync.Mutex        // guards cache, done, shapes
	cache  map[string][]byte // values read after the fence (they no longer change)
	done   bool              // fenced was closed
	shapes map[string]bool   // shapes of the keys Set before the fence
}

// shape is key with every run of digits replaced by '#'.
func shape(key string) string {
	b := make([]byte, 0, len(key))
	for i := 0; i < len(key); i++ {
		if key[i] >= '0' && key[i] <= '9' {
			if len(b) == 0 || b[len(b)-1] != '#' {
				b = append(b, '#')
			}
			continue
		}
		b = append(b, key[i])
	}
	return string(b)
}

func newStore(c *Client) *Store {
	return &Store{c: c, fenced: make(chan struct{}), cache: map[string][]byte{}, shapes: map[string]bool{}}
}

// chunkSuffix leaves room in a key for the number of a continuation chunk.
const chunkSuffix = 5 // "~" and up to 4 digits

// pmiKey returns the PMI key that carries key.
func (s *Store) pmiKey(key string) string {
	ok := key != "" && len(key)+chunkSuffix <= s.c.MaxKey()
	for i := 0; ok && i < len(key); i++ {
		ok = isKeyChar(key[i]) && key[i] != '/'
	}
	if ok {
		return key
	}
	h := sha256.Sum256([]byte(key))
	n := min(32, s.c.MaxKey()-chunkSuffix-len("gompi.h."))
	return "gompi.h." + hex.EncodeToString(h[:])[:max(n, 8)]
}

// Set publishes value under key; the other ranks can read it after the
// wire-up fence. Set after that fence is ErrAfterFence. value is copied.
func (s *Store) Set(key string, value []byte) error {
	select {
	case <-s.fenced:
		if s.live == nil {
			return fmt.Errorf("pmi: set %s after the wire-up fence: no store for it", key)
		}
		ctx, cancel := context.WithTimeout(context.Background(), liveDialTimeout)
		defer cancel()
		c, err := s.live.client(ctx)
		if err != nil {
			return fmt.Errorf("set %s: %w", key, err)
		}
		return c.Set(key, value)
	default:
	}
	s.mu.Lock()
	s.shapes[shape(key)] = true
	s.mu.Unlock()
	return s.put(context.Background(), key, value)
}

// put publishes value under key without the fence check.
func (s *Store) put(ctx context.Context, key string, value []byte) error {
	enc := base64.RawURLEncoding.EncodeToString(value)
	chunk := s.c.MaxValue() - 8 // room for the "N:" count of the first chunk
	if chunk < 16 {
		return fmt.Errorf("pmi: the server's value limit %d is too small", s.c.MaxValue())
	}
	n := max(1, (len(enc)+chunk-1)/chunk)
	if n > 9999 {
		return fmt.Errorf("pmi: set %s: value of %d bytes is too long", key, len(value))
	}
	pk := s.pmiKey(key)
	for i := range n {
		part := enc[min(i*chunk, len(enc)):min((i+1)*chunk, len(enc))]
		k := pk
		if i == 0 {
			part = strconv.Itoa(n) + ":" + part
		} else {
			k += "~" + strconv.Itoa(i)
		}
		if err := s.c.Put(ctx, k, part); err != nil {
			return err
		}
	}
	return nil
}

// Get returns the value published under key. It waits (until ctx ends)
// for the wire-up fence; after it a key no rank published is an error
// wrapping ErrNotFound. The returned slice is the caller's.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	select {
	case <-s.fenced:
	case <-ctx.Done():
		return nil, fmt.Errorf("get %s before the wire-up fence: %w", key, context.Cause(ctx))
	}
	s.mu.Lock()
	static := s.shapes[shape(key)]
	s.mu.Unlock()
	if static || s.live == nil {
		return s.get(ctx, key)
	}
	c, err := s.live.client(ctx)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w (%w)", key, err, ErrNotFound)
	}
	v, err := c.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w (%w)", key, err, ErrNotFound)
	}
	return v, nil
}

// liveDialTimeout bounds connecting to rank 0's store for a Set.
const liveDialTimeout = 30 * time.Second

// get reads key without waiting for the fence.
func (s *Store) get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	v, ok := s.cache[key]
	s.mu.Unlock()
	if ok {
		return append([]byte(nil), v...), nil
	}
	pk := s.pmiKey(key)
	first, found, err := s.c.Get(ctx, pk)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	ns, enc, ok := strings.Cut(first, ":")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n < 1 || n > 9999 {
		return nil, fmt.Errorf("get %s: %w: value %q is not gompi's encoding", key, ErrProtocol, clip(first))
	}
	var b strings.Builder
	b.WriteString(enc)
	for i := 1; i < n; i++ {
		part, found, err := s.c.Get(ctx, pk+"~"+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("get %s: chunk %d of %d: %w", key, i, n, ErrNotFound)
		}
		b.WriteString(part)
	}
	v, err = base64.RawURLEncoding.DecodeString(b.String())
	if err != nil {
		return nil, fmt.Errorf("get %s: %w: %v", key, ErrProtocol, err)
	}
	s.mu.Lock()
	s.cache[key] = v
	s.mu.Unlock()
	return append([]byte(nil), v...), nil
}

// fenceDone records that a fence completed: Gets may proceed.
func (s *Store) fenceDone() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.done = true
		close(s.fenced)
	}
}

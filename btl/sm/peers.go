package sm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
)

// resolve looks up every local rank once. Ranks whose entry does not
// appear within btl_sm_wireup_timeout are left out: AddProc finds them
// unreachable.
func (m *Module) resolve() error {
	m.resolveMu.Lock()
	defer m.resolveMu.Unlock()
	if m.resolved {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.wireTimeout)
	defer cancel()
	var missing []string
	for l := range m.peers {
		if l == m.local {
			continue
		}
		if _, err := m.lookup(ctx, l); err != nil {
			if m.closed.Load() {
				return btl.ErrClosed
			}
			missing = append(missing, fmt.Sprintf("local rank %d: %v", l, err))
		}
	}
	if len(missing) > 0 {
		// Not retried by AddProc (each try would wait again); such a rank
		// is looked up later only if it sends to us.
		m.env.Logf("sm: rank %d: local ranks not reachable by shared memory: %v", m.rank, missing)
	}
	m.resolved = true
	return nil
}

// peerAt returns the peer with local rank l with its segment mapped, for
// Progress, which found a fragment of l in its FIFO. It looks l up and maps
// its segment on its first fragment; nil when l cannot be reached or its
// segment cannot be mapped (the peer is then failed and reported).
func (m *Module) peerAt(l int) *peer {
	if l < 0 || l >= len(m.peers) || l == m.local {
		return nil
	}
	if p := m.peers[l].p.Load(); p != nil && p.mapped.Load() {
		return p
	}
	return m.reach(l)
}

// reach is peerAt's first fragment from l.
func (m *Module) reach(l int) *peer {
	p := m.peers[l].p.Load()
	if p == nil {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.wireTimeout)
		defer cancel()
		var err error
		if p, err = m.lookup(ctx, l); err != nil {
			m.env.Logf("sm: rank %d: fragment from local rank %d, which cannot be reached: %v", m.rank, l, err)
			return nil
		}
	}
	p.ep.mu.Lock()
	m.attach(p)
	p.ep.mu.Unlock()
	if !p.mapped.Load() {
		return nil
	}
	return p
}

// lookup reads local rank l's entry in the store and records the peer,
// its segment not mapped yet. An error means l is not (yet) reachable; a
// peer that is found but gone is returned marked failed.
func (m *Module) lookup(ctx context.Context, l int) (*peer, error) {
	s := &m.peers[l]
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.p.Load(); p != nil {
		return p, nil
	}
	b, err := m.env.Store.Get(ctx, localKey(m.id, l))
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	e, err := decodeWire(b)
	if err != nil {
		return nil, err
	}
	if e.id != m.id || e.local != l || e.localSize != len(m.peers) || e.rank == m.rank {
		return nil, fmt.Errorf("rank %d (local %d of %d, %v) does not share this kernel and user (%v): %w",
			e.rank, e.local, e.localSize, e.id, m.id, btl.ErrUnreachable)
	}
	p := &peer{m: m, local: l, rank: e.rank, pid: e.pid, entry: e, state: unmappedState}
	p.ep = &endpoint{m: m, p: p}
	m.mapMu.Lock() // release waits until the peer is recorded
	defer m.mapMu.Unlock()
	if m.closed.Load() {
		return nil, btl.ErrClosed
	}
	// The single-copy probe needs only the pid: made here, every peer's
	// refusal drops put and get before the PML reads Caps for its peers.
	gone := false
	if m.Caps()&btl.CapRDMA != 0 {
		switch err := sys.CMAPermitted(p.pid); {
		case errors.Is(err, mpierr.ErrProcFailed):
			err = fmt.Errorf("sm: rank %d (pid %d) is gone: %v: %w", e.rank, e.pid, err, mpierr.ErrProcFailed)
			p.failed.Store(&err)
			gone = true
		case err != nil:
			p.cmaErr = err
			m.caps.Store(m.caps.Load() &^ uint32(btl.CapRDMA))
			setStatus("single copy: none (%v)", err)
			m.env.Logf("sm: rank %d: put/get disabled: %v", m.rank, err)
		}
	}
	m.byRankMu.Lock()
	m.byRank[p.rank] = p
	m.byRankMu.Unlock()
	s.p.Store(p)
	if gone { // after the Store: Progress must find p when it looks
		m.events.Store(true)
		m.kick()
	}
	return p, nil
}

// unmappedState is the state word of every peer whose segment is not
// mapped yet; it says stateUnmapped.
var unmappedState = func() *atomic.Uint64 {
	w := new(atomic.Uint64)
	w.Store(stateUnmapped << 32)
	return w
}()

// attach maps p's segment, on first use. Afterwards p is mapped, or
// failed (it was gone: its segment could not be mapped or is not its), or
// the module is closed. Called with p.ep.mu held.
func (m *Module) attach(p *peer) {
	m.mapMu.Lock() // release waits until the mapping is recorded
	defer m.mapMu.Unlock()
	if p.mapped.Load() || p.failure() != nil || m.closed.Load() {
		return
	}
	if err := m.mapPeer(p, p.entry); err != nil {
		m.fail(p, fmt.Errorf("sm: rank %d (pid %d) is gone: %v: %w", p.rank, p.pid, err, mpierr.ErrProcFailed))
		m.kick() // Progress reports it
		return
	}
	p.mapped.Store(true)
	m.env.Logf("sm: rank %d: mapped the segment of rank %d (local %d) on first use", m.rank, p.rank, p.local)
}

// mapPeer maps the segment that entry e names, checks it is that rank's,
// and starts watching the process.
func (m *Module) mapPeer(p *peer, e wireEntry) error {
	w, err := sys.WatchPid(e.pid)
	if err != nil {
		return err
	}
	seg, err := m.openSegment(e)
	if err != nil {
		w.Close()
		return err
	}
	lay, id, err := readHeader(seg)
	if err == nil && (id.nonce != e.nonce || id.pid != e.pid || id.rank != e.rank || id.local != e.local) {
		err = errors.New("segment belongs to another process (pid reused?)")
	}
	if err != nil {
		sys.Unmap(seg)
		w.Close()
		return err
	}
	p.seg, p.lay, p.watch = seg, lay, w
	p.fifo = newFifo(seg, &p.lay)
	p.state = word64(seg, offState)
	p.seq = word32(seg, offSeq)
	p.fboxAvail = word64(seg, offFboxAvail)
	p.helpPosts = word64(seg, offHelpPosts)
	m.bg.Add(1)
	go m.watchPeer(p)
	return nil
}

// openSegment maps a peer's memfd through /proc/<pid>/fd/<fd>. The link
// is checked first to be the job's memfd, so a reused pid never makes us
// open some other file of that process (a FIFO, a device).
func (m *Module) openSegment(e wireEntry) ([]byte, error) {
	path := "/proc/" + strconv.Itoa(e.pid) + "/fd/" + strconv.Itoa(e.fd)
	link, err := os.Readlink(path)
	if err != nil {
		return nil, err
	}
	want := fmt.Sprintf("/memfd:gompi-sm.%s.%d", m.env.JobID, e.rank)
	if len(link) < len(want) || link[:len(want)] != want {
		return nil, fmt.Errorf("%s is %q, not the rank's segment", path, link)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() != int64(e.size) {
		return nil, fmt.Errorf("%s: %v, %d bytes; want a %d-byte segment", path, st.Mode(), st.Size(), e.size)
	}
	return sys.MapShared(f, e.size)
}

// watchPeer reports the exit of a peer's process.
func (m *Module) watchPeer(p *peer) {
	defer m.bg.Done()
	if err := p.watch.Wait(); err != nil {
		return // closed
	}
	if p.state.Load()>>32 == stateClosed {
		p.closed.Store(true)
	} else {
		m.fail(p, fmt.Errorf("sm: rank %d (pid %d) exited: %w", p.rank, p.pid, mpierr.ErrProcFailed))
	}
	m.events.Store(true)
	m.kick() // the segment stays mapped until Close has waited for this goroutine
}

// Package ibvtest is the provider-independent conformance suite of the
// verbs model (btl/verbs/ibv): one Run that every provider's tests call
// with a Fixture saying how to open its devices and which cases it cannot
// run (each such case is skipped with the provider's reason logged).
//
// Each case checks one rule of the model (notes/protocols.md section F)
// in a way that fails on a device that breaks it: the bytes that arrive,
// the completion statuses, IDs and order, the error classes of verb calls
// and the QP states.
//
// The connection helpers (Endpoint, ConnOpts, Connect and the attribute
// builders) show the RESET->INIT->RTR->RTS pattern every RC user follows,
// and Poll waits for completions with a context.
package ibvtest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// Fixture says how the suite reaches a provider.
type Fixture struct {
	// Open opens a new context on device dev: 0, and 1 when TwoDevices is
	// set. The suite closes every context it opens (and checks that Close
	// succeeds once everything made from it is destroyed).
	Open func(t testing.TB, dev int) ibv.Context
	// TwoDevices runs the data-path cases a second time with the two QPs
	// of each connection on two devices (Open(t, 0) and Open(t, 1));
	// otherwise both QPs share one device (loopback).
	TwoDevices bool
	// Port is the port the suite uses (0: port 1).
	Port uint8
	// GIDIndex is the source GID table index.
	GIDIndex int
	// Timeout bounds each wait for a completion or event (0: 20 s). A
	// test's own deadline (go test -timeout) shortens it.
	Timeout time.Duration
	// Skip maps a case name (Cases lists them) to the reason the provider
	// cannot run it, e.g. a device whose retry exhaustion takes minutes.
	// The reason is logged with the skip. A name that is not a case fails
	// the suite, so that a typo does not skip silently.
	Skip map[string]string
}

type testCase struct {
	name string
	// pair: the case runs once per topology (loopback, two devices).
	pair bool
	run  func(t *testing.T, e *env)
}

// Cases lists the names of the suite's cases, the keys Fixture.Skip takes.
func Cases() []string {
	var out []string
	for _, c := range allCases() {
		out = append(out, c.name)
	}
	return out
}

func allCases() []testCase {
	var all []testCase
	all = append(all, deviceCases...)
	all = append(all, stateCases...)
	all = append(all, mrCases...)
	all = append(all, errorCases...)
	all = append(all, dataCases...)
	all = append(all, queueCases...)
	all = append(all, atomicCases...)
	return all
}

// Run runs every case against f's provider, each as a subtest named after
// the case (under "loopback/" and, with TwoDevices, "twodev/" for the
// cases that connect two QPs).
func Run(t *testing.T, f Fixture) {
	if f.Open == nil {
		t.Fatal("ibvtest: Fixture.Open is nil")
	}
	if f.Port == 0 {
		f.Port = 1
	}
	if f.Timeout == 0 {
		f.Timeout = 20 * time.Second
	}
	names := Cases()
	for k := range f.Skip {
		if !slices.Contains(names, k) {
			t.Errorf("ibvtest: Fixture.Skip names %q, which is not a case (cases: %v)", k, names)
		}
	}
	topos := []topology{loopback}
	if f.TwoDevices {
		topos = append(topos, twoDevices)
	}
	for _, c := range allCases() {
		if !c.pair {
			t.Run(c.name, func(t *testing.T) { runCase(t, &f, c, loopback) })
		}
	}
	for _, topo := range topos {
		t.Run(topo.String(), func(t *testing.T) {
			for _, c := range allCases() {
				if c.pair {
					t.Run(c.name, func(t *testing.T) { runCase(t, &f, c, topo) })
				}
			}
		})
	}
}

func runCase(t *testing.T, f *Fixture, c testCase, topo topology) {
	if why, ok := f.Skip[c.name]; ok {
		t.Skipf("provider opts out of %s: %s", c.name, why)
	}
	e := &env{t: t, f: f, topo: topo}
	c.run(t, e)
}

type topology int

const (
	loopback topology = iota
	twoDevices
)

func (tp topology) String() string {
	if tp == twoDevices {
		return "twodev"
	}
	return "loopback"
}

// env is one case's view of the fixture: contexts it opened and the
// deadline of its waits.
type env struct {
	t    *testing.T
	f    *Fixture
	topo topology
	ctxs [2]ibv.Context
}

// dev returns the case's context on device dev (opened on first use,
// closed at the end of the case). In the loopback topology every device
// index is device 0.
func (e *env) dev(dev int) ibv.Context {
	if e.topo == loopback {
		dev = 0
	}
	if e.ctxs[dev] == nil {
		c := e.f.Open(e.t, dev)
		if c == nil {
			e.t.Fatalf("Fixture.Open(%d) returned nil", dev)
		}
		e.ctxs[dev] = c
		e.t.Cleanup(func() {
			if err := c.Close(); err != nil && !e.t.Failed() {
				e.t.Errorf("closing the context of device %d after every object is destroyed: %v", dev, err)
			}
		})
	}
	return e.ctxs[dev]
}

// wait returns a context that ends after the fixture's timeout (or d when
// longer), or before the test's own deadline.
func (e *env) wait(d time.Duration) context.Context {
	d = max(d, e.f.Timeout)
	if dl, ok := e.t.Deadline(); ok {
		if left := time.Until(dl) - 2*time.Second; left < d {
			d = max(left, time.Second)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *env) port() uint8 { return e.f.Port }

// must fails the case on err, naming what was done.
func must(t testing.TB, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}

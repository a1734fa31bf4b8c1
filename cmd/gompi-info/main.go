// Command gompi-info lists the transports compiled into gompi and whether
// each is usable on this machine (with the reason when not), every
// tunable parameter with its default, current value, source and help, and
// with --protocols which protocol each message size gets per transport.
//
//	gompi-info
//	gompi-info --protocols --param btl_tcp_eager_limit=16k
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/self"
	"github.com/gompi-org/gompi/internal/params"
	_ "github.com/gompi-org/gompi/mpi" // registers the transports and their parameters
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/spf13/pflag"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, out, errw io.Writer) int {
	fs := pflag.NewFlagSet("gompi-info", pflag.ContinueOnError)
	fs.SetOutput(errw)
	fs.Usage = func() {
		fmt.Fprintln(errw, "usage: gompi-info [--protocols] [--param name=value]...")
		fs.PrintDefaults()
	}
	protocols := fs.Bool("protocols", false, "show which protocol each message size gets on each transport")
	var ps []string
	fs.StringArrayVar(&ps, "param", nil, "set a parameter name=value (repeatable) before reporting")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(errw, "gompi-info: %v\n", err)
		return 2
	}
	var over [][2]string
	for _, p := range ps {
		n, v, ok := strings.Cut(p, "=")
		if !ok {
			fmt.Fprintf(errw, "gompi-info: --param %q: want name=value\n", p)
			return 2
		}
		over = append(over, [2]string{n, v})
	}
	set, err := params.NewSet(over)
	if err != nil {
		fmt.Fprintln(errw, "gompi-info:", err)
		return 1
	}
	mods := transports(out, set)
	rdmaDevices(out, set)
	if *protocols {
		protocolTable(out, set, mods)
		return 0
	}
	fmt.Fprintln(out, "\nParameters (set with GOMPI_<NAME>, gorun --param name=value, or mpi.WithParam):")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tDEFAULT\tVALUE\tSOURCE\tHELP")
	for _, d := range params.All() {
		v, src := set.Value(d.Name)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.Kind, show(d.Default), show(v), src, d.Help)
	}
	tw.Flush()
	return 0
}

func show(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

type opened struct {
	name   string
	limits btl.Limits
	caps   btl.Caps
}

// memStore is an in-process wire-up store so that transports can be opened
// (and so probed) outside a gorun job.
type memStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memStore) Set(k string, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[k] = append([]byte(nil), v...)
	return nil
}

func (s *memStore) Get(ctx context.Context, k string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m[k]; ok {
		return v, nil
	}
	return nil, fmt.Errorf("key %q not set", k)
}

// transports opens every transport once, as rank 0 of a one-rank job, and
// reports whether it is usable here.
func transports(out io.Writer, set *params.Set) []opened {
	fmt.Fprintln(out, "Transports (btl):")
	env := &btl.Env{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, JobID: "gompi-info", Secret: []byte("gompi-info"),
		Params: set, Store: &memStore{m: map[string][]byte{}}, Dispatch: &btl.Dispatcher{}, Logf: func(string, ...any) {}}
	var res []opened
	report := func(name string, mods []btl.Module, err error) {
		selected := btl.Selected(set.String("btl"), name)
		switch {
		case err != nil:
			fmt.Fprintf(out, "  %-6s not usable here: %v\n", name, err)
			// gompi-info runs alone, so a transport that needs a peer on
			// this host (sm) cannot open: its protocol table still follows
			// from its parameters, with the capabilities btl_<t>_flags allows.
			if l, caps, _, serr := btl.Settings(set, name, btl.CapSend|btl.CapSendImmediate|btl.CapSendInPlace|btl.CapRDMA); serr == nil && set.Has("btl_"+name+"_eager_limit") {
				res = append(res, opened{name + " (not usable here: from its parameters and btl_" + name + "_flags)", l, caps})
			}
		case len(mods) == 0:
			fmt.Fprintf(out, "  %-6s not usable here: no modules\n", name)
		default:
			m := mods[0]
			sel := ""
			if !selected {
				sel = " (excluded by btl=" + set.String("btl") + ")"
			}
			fmt.Fprintf(out, "  %-6s usable%s: caps %s, exclusivity %d, eager_limit %d, max_send_size %d\n",
				name, sel, m.Caps(), m.Exclusivity(), m.Limits().EagerLimit, m.Limits().MaxSendSize)
			if s, ok := m.(interface{ Status() string }); ok {
				fmt.Fprintf(out, "         %s\n", s.Status())
			}
			res = append(res, opened{name, m.Limits(), m.Caps()})
		}
		for _, m := range mods {
			m.Close()
		}
	}
	m, err := self.NewWorld().Attach(env)
	if err != nil {
		report("self", nil, err)
	} else {
		report("self", []btl.Module{m}, nil)
	}
	for _, c := range btl.Components() {
		mods, err := c.Open(env)
		report(c.Name(), mods, err)
	}
	return res
}

// protocolTable prints, per transport, which protocol each size range gets.
func protocolTable(out io.Writer, set *params.Set, mods []opened) {
	force, _ := pml.ParseForce(set.String("pml_force_protocol"))
	leave := set.Bool("pml_leave_pinned")
	fmt.Fprintf(out, "\nProtocols by message size (pml_force_protocol=%q, pml_leave_pinned=%v):\n", set.String("pml_force_protocol"), leave)
	for _, m := range mods {
		fmt.Fprintf(out, "\n  %s (eager payload <= %d B, first rendezvous chunk %d B, min_rdma_pipeline_size %d B, caps %s)\n",
			m.name, pml.EagerMax(m.limits), pml.FirstChunk(m.limits), m.limits.MinRDMAPipelineSize, m.caps)
		for _, row := range []struct {
			what   string
			mode   pml.Mode
			contig bool
		}{{"standard, contiguous", pml.Standard, true}, {"standard, non-contiguous", pml.Standard, false},
			{"synchronous, contiguous", pml.Synchronous, true}, {"buffered", pml.Buffered, true}} {
			fmt.Fprintf(out, "    %s:\n", row.what)
			for _, r := range ranges(func(n int) string {
				p := pml.Select(pml.SendInfo{Mode: row.mode, Size: n, Contiguous: row.contig, Caps: m.caps, Limits: m.limits, LeavePinned: leave, Force: force})
				if p == pml.SendPipeline || p == pml.RDMAPipeline {
					c := pml.Choose(pml.RecvInfo{MsgLen: n, Received: min(n, pml.FirstChunk(m.limits)), Flags: flagsFor(p, row.contig), Contiguous: true, Caps: m.caps, Limits: m.limits, Force: force})
					if c == pml.RecvRDMAPipeline {
						return pml.RDMAPipeline.String()
					}
					if p == pml.RDMAPipeline {
						return pml.SendPipeline.String() + " (receiver's choice)"
					}
				}
				return p.String()
			}, m.limits) {
				fmt.Fprintf(out, "      %-28s %s\n", r.span, r.proto)
			}
		}
	}
}

func flagsFor(p pml.Protocol, contig bool) uint8 {
	if p == pml.RDMAPipeline && contig {
		return hdr.FlagContig
	}
	return 0
}

type rangeRow struct{ span, proto string }

// ranges groups the sizes at every threshold into ranges with one protocol.
func ranges(f func(int) string, l btl.Limits) []rangeRow {
	cands := map[int]bool{0: true, 1 << 40: true}
	for _, t := range []int{pml.ImmediateMax, pml.EagerMax(l), l.MinRDMAPipelineSize, l.RDMAPipelineSendLength + pml.FirstChunk(l)} {
		if t >= 0 && t < 1<<40 {
			cands[t], cands[t+1] = true, true
		}
	}
	var pts []int
	for p := range cands {
		pts = append(pts, p)
	}
	sort.Ints(pts)
	var rows []rangeRow
	start := 0
	cur := f(0)
	for i := 1; i < len(pts); i++ {
		if p := f(pts[i]); p != cur {
			rows = append(rows, rangeRow{fmt.Sprintf("%s .. %s", size(start), size(pts[i]-1)), cur})
			start, cur = pts[i], p
		}
	}
	rows = append(rows, rangeRow{fmt.Sprintf("%s and up", size(start)), cur})
	return rows
}

// size prints n in bytes: one unit for every bound, so that neighbouring
// rows read alike (2147484671 B, then 2147484672 B, not 2097153 KiB).
func size(n int) string { return fmt.Sprintf("%d B", n) }

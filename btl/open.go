package btl

import (
	"errors"
	"fmt"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// Open opens, in name order, every registered component that list selects
// (the btl parameter: a comma list, ^list to exclude, empty for all; see
// Selected) and returns their modules, logging each through env.Logf.
//
// A component that cannot be used here is left out: its "name: reason" is
// in unused, for the error that tells a user why no transport reaches a
// peer. A component whose Open fails with an error wrapping mpierr.ErrArg
// (a bad parameter value: the user's mistake, not the host's) stops Open
// with that error, prefixed with the component's name; the modules opened
// before it come back with it, and the caller closes them.
func Open(env *Env, list string) (mods []Module, unused []string, err error) {
	for _, comp := range Components() {
		if !Selected(list, comp.Name()) {
			continue
		}
		ms, err := comp.Open(env)
		if err != nil {
			if errors.Is(err, mpierr.ErrArg) {
				return mods, unused, fmt.Errorf("transport %s: %w", comp.Name(), err)
			}
			env.Logf("transport %s not used: %v", comp.Name(), err)
			unused = append(unused, fmt.Sprintf("%s: %v", comp.Name(), err))
			continue
		}
		for _, m := range ms {
			env.Logf("transport %s: caps %v, exclusivity %d", m.Name(), m.Caps(), m.Exclusivity())
		}
		mods = append(mods, ms...)
	}
	return mods, unused, nil
}

// Reach returns the endpoint by which this process sends to world rank
// peer: every module is asked (AddProc, so that each knows the peer, also
// those not chosen), and the endpoint of the highest Exclusivity wins, the
// earliest module's on a tie. When no module reaches peer it returns nil
// and the errors of the modules that refused, one line each.
func Reach(mods []Module, peer int) (Endpoint, []string) {
	var best Endpoint
	var reasons []string
	for _, m := range mods {
		ep, err := m.AddProc(peer)
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		if ep != nil && (best == nil || ep.Module().Exclusivity() > best.Module().Exclusivity()) {
			best = ep
		}
	}
	return best, reasons
}

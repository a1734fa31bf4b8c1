// Package params is gompi's registry of tunable parameters.
//
// Components register each parameter once (name, kind, default, help) from an
// init function. A job instance resolves the values it runs with into a Set:
// the registered default, overridden by the environment variable
// GOMPI_<NAME upper-case>, overridden by gorun flags (passed to ranks in
// GOMPI_FLAG_PARAMS) and by mpi.WithParam options. Names follow Open MPI's
// scheme (btl_tcp_eager_limit, pml_send_pipeline_depth, ...).
package params

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// Kind is the type of a parameter's value.
type Kind int

const (
	Int      Kind = iota // a decimal integer
	Size                 // bytes; suffixes k, m, g (powers of 1024) accepted
	Bool                 // true/false, 1/0, yes/no, on/off
	String               // free text (comma lists, names)
	Duration             // a Go duration such as 500ms
)

func (k Kind) String() string {
	switch k {
	case Int:
		return "int"
	case Size:
		return "size"
	case Bool:
		return "bool"
	case Duration:
		return "duration"
	}
	return "string"
}

// Def describes one parameter.
type Def struct {
	Name    string
	Kind    Kind
	Default string
	Help    string
}

// Source says where a resolved value came from.
type Source int

const (
	FromDefault Source = iota
	FromEnv
	FromFlag // a gorun flag or an mpi.WithParam option
)

func (s Source) String() string {
	switch s {
	case FromEnv:
		return "environment"
	case FromFlag:
		return "flag"
	}
	return "default"
}

var (
	regMu sync.RWMutex
	reg   = map[string]Def{}
)

// Register adds a parameter. Registering the same name twice with a different
// definition, or a default that does not parse, is a program bug and panics.
func Register(d Def) {
	if _, err := parse(d.Kind, d.Default); err != nil {
		panic(fmt.Sprintf("params: default of %s: %v", d.Name, err))
	}
	regMu.Lock()
	defer regMu.Unlock()
	if old, ok := reg[d.Name]; ok && old != d {
		panic("params: " + d.Name + " registered twice")
	}
	reg[d.Name] = d
}

// Lookup returns the definition of name.
func Lookup(name string) (Def, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	d, ok := reg[name]
	return d, ok
}

// All returns every registered parameter, sorted by name.
func All() []Def {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]Def, 0, len(reg))
	for _, d := range reg {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// EnvName is the environment variable that sets name: GOMPI_<NAME>.
func EnvName(name string) string { return "GOMPI_" + strings.ToUpper(name) }

// FlagEnv is the variable through which gorun hands its --param values and
// named flags to the ranks: "name=value" entries separated by newlines.
const FlagEnv = "GOMPI_FLAG_PARAMS"

type value struct {
	raw string
	v   any // int, bool, string or time.Duration
	src Source
}

// Set is the resolved parameter values of one job instance. It is read-only
// after NewSet and safe for concurrent use.
type Set struct {
	vals map[string]value
}

// NewSet resolves every registered parameter: default < GOMPI_<NAME> <
// GOMPI_FLAG_PARAMS < overrides (in order; later wins). An unknown name or a
// value that does not parse is an error wrapping mpierr.ErrArg.
func NewSet(overrides [][2]string) (*Set, error) {
	s := &Set{vals: map[string]value{}}
	for _, d := range All() {
		v, _ := parse(d.Kind, d.Default)
		s.vals[d.Name] = value{raw: d.Default, v: v, src: FromDefault}
		if e, ok := os.LookupEnv(EnvName(d.Name)); ok {
			if err := s.set(d.Name, e, FromEnv); err != nil {
				return nil, fmt.Errorf("%s: %w", EnvName(d.Name), err)
			}
		}
	}
	if f := os.Getenv(FlagEnv); f != "" {
		for _, line := range strings.Split(f, "\n") {
			if line = strings.TrimSpace(line); line == "" {
				continue
			}
			name, val, ok := strings.Cut(line, "=")
			if !ok {
				return nil, mpierr.Errorf(mpierr.ErrArg, "parameter %q: want name=value", line)
			}
			if err := s.set(strings.TrimSpace(name), strings.TrimSpace(val), FromFlag); err != nil {
				return nil, err
			}
		}
	}
	for _, o := range overrides {
		if err := s.set(o[0], o[1], FromFlag); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Set) set(name, raw string, src Source) error {
	d, ok := Lookup(name)
	if !ok {
		return mpierr.Errorf(mpierr.ErrArg, "unknown parameter %q (gompi-info lists them)", name)
	}
	v, err := parse(d.Kind, raw)
	if err != nil {
		return mpierr.Errorf(mpierr.ErrArg, "parameter %s=%q: %v", name, raw, err)
	}
	s.vals[name] = value{raw: raw, v: v, src: src}
	return nil
}

func (s *Set) get(name string) value {
	v, ok := s.vals[name]
	if !ok {
		panic("params: " + name + " is not registered")
	}
	return v
}

// Int returns an Int or Size parameter.
func (s *Set) Int(name string) int { return s.get(name).v.(int) }

// Bool returns a Bool parameter.
func (s *Set) Bool(name string) bool { return s.get(name).v.(bool) }

// String returns a String parameter.
func (s *Set) String(name string) string { return s.get(name).v.(string) }

// Duration returns a Duration parameter.
func (s *Set) Duration(name string) time.Duration { return s.get(name).v.(time.Duration) }

// Value returns the textual value of name and where it came from.
func (s *Set) Value(name string) (string, Source) {
	v := s.get(name)
	return v.raw, v.src
}

// Has reports whether name is registered in this set.
func (s *Set) Has(name string) bool { _, ok := s.vals[name]; return ok }

func parse(k Kind, raw string) (any, error) {
	switch k {
	case Int:
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("not an integer")
		}
		return n, nil
	case Size:
		return ParseSize(raw)
	case Bool:
		switch strings.ToLower(strings.TrimSpace(raw)) {
		case "1", "true", "yes", "on":
			return true, nil
		case "0", "false", "no", "off", "":
			return false, nil
		}
		return nil, fmt.Errorf("not a boolean")
	case Duration:
		d, err := time.ParseDuration(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("not a duration")
		}
		return d, nil
	}
	return raw, nil
}

// ParseSize parses a byte count with an optional k, m or g suffix (powers of
// 1024, case-insensitive, an optional trailing b or ib: 4k, 4K, 4KiB, 1m).
// Negative values and values beyond the int range are errors.
func ParseSize(raw string) (int, error) {
	s := strings.ToLower(strings.TrimSpace(raw))
	s = strings.TrimSuffix(s, "ib")
	s = strings.TrimSuffix(s, "b")
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k':
			mult, s = 1<<10, s[:n-1]
		case 'm':
			mult, s = 1<<20, s[:n-1]
		case 'g':
			mult, s = 1<<30, s[:n-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (bytes, with optional k, m or g)", raw)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large", raw)
	}
	return int(n * mult), nil
}

// FormatSize renders n with the largest exact k/m/g suffix.
func FormatSize(n int) string {
	switch {
	case n != 0 && n%(1<<30) == 0:
		return strconv.Itoa(n>>30) + "g"
	case n != 0 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + "m"
	case n != 0 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + "k"
	}
	return strconv.Itoa(n)
}

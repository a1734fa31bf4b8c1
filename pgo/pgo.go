// Package pgo carries gompi.pgo, a CPU profile of gompi's message paths for
// Go's profile-guided optimization (go build -pgo=FILE), so that gorun can
// build programs with it. bench/pgo.sh regenerates the file;
// docs/tuning.md says what it changes and what it measured.
package pgo

import _ "embed"

// Profile is the content of gompi.pgo (pprof format).
//
//go:embed gompi.pgo
var Profile []byte

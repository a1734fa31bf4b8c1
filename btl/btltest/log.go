package btltest

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Log is an Env.Logf for a module under test. It keeps every message,
// and forwards them to t (with -v) only until the test ends, since a
// module's goroutines may log after it.
type Log struct {
	t    testing.TB
	done atomic.Bool
	mu   sync.Mutex
	msgs []string
}

// NewLog returns a Log that forwards to t until t's test ends.
func NewLog(t testing.TB) *Log {
	l := &Log{t: t}
	t.Cleanup(func() { l.done.Store(true) })
	return l
}

// Logf records one message.
func (l *Log) Logf(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	l.mu.Lock()
	l.msgs = append(l.msgs, msg)
	l.mu.Unlock()
	if !l.done.Load() && testing.Verbose() {
		l.t.Log(msg)
	}
}

// Contains reports whether a message so far contains s.
func (l *Log) Contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// Messages returns a copy of the messages so far.
func (l *Log) Messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

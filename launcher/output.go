package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
)

// maxLine is the longest line written in one piece. A longer line (or
// output that never ends a line) is forwarded in pieces of this size, each
// still written whole.
const maxLine = 1 << 20

// output serialises everything gorun writes: the ranks' forwarded lines and
// gorun's own messages. Each Write it makes holds one or more whole lines, so
// lines from different ranks never mix.
type output struct {
	tag   bool
	label bool // a host daemon's output: every line starts "RANK: " for gorun to read

	mu     sync.Mutex // guards writes to stdout and stderr
	stdout io.Writer
	stderr io.Writer
}

func newOutput(stdout, stderr io.Writer, tag bool) *output {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	return &output{tag: tag, stdout: stdout, stderr: stderr}
}

// printf writes one gorun message line to stderr.
func (o *output) printf(format string, args ...any) {
	msg := fmt.Appendf([]byte("gorun: "), format, args...)
	if len(msg) == 0 || msg[len(msg)-1] != '\n' {
		msg = append(msg, '\n')
	}
	o.mu.Lock()
	o.stderr.Write(msg)
	o.mu.Unlock()
}

// Write makes output an io.Writer of whole lines to stderr, for log.Logger.
func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stderr.Write(p)
}

// forward copies r (a rank's stdout or stderr pipe) to w line by line until
// EOF or a read error (the pipe was closed), then writes any final partial
// line. With tagging every line starts with "[rank] ".
func (o *output) forward(r io.Reader, toStderr bool, rank int) {
	w := o.stdout
	if toStderr {
		w = o.stderr
	}
	var prefix []byte
	relabel := false
	switch {
	case o.label:
		prefix = []byte(strconv.Itoa(rank) + ": ")
	case rank < 0:
		// A launcher's lines (srun --label, a host daemon): "N: text"
		// becomes "[N] text", or "text" without tagging.
		relabel = true
	case o.tag:
		prefix = []byte("[" + strconv.Itoa(rank) + "] ")
	}
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte // the current line, prefix included
	atStart := true // whether line holds no data yet
	emit := func(addNewline bool) {
		if atStart {
			return
		}
		if addNewline {
			line = append(line, '\n')
		}
		if relabel {
			line = relabelLine(line, o.tag)
		}
		o.mu.Lock()
		w.Write(line)
		o.mu.Unlock()
		line, atStart = line[:0], true
	}
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			if atStart {
				line = append(line, prefix...)
				atStart = false
			}
			line = append(line, chunk...)
			if chunk[len(chunk)-1] == '\n' {
				emit(false)
			} else {
				// Pieces of an over-long line: each written whole, the
				// rest continued without a new prefix.
				for len(line) >= maxLine {
					o.mu.Lock()
					w.Write(line[:maxLine])
					o.mu.Unlock()
					line = line[:copy(line, line[maxLine:])]
				}
			}
		}
		if err == nil || errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		// EOF, or the pipe was closed under us: flush the partial line. When
		// tagging, end it so that the next line's tag starts a line.
		emit(o.tag || o.label)
		if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
			o.printf("rank %d: reading output: %v", rank, err)
		}
		return
	}
}

// relabelLine rewrites a line that srun --label or a host daemon wrote,
// " 3: text", as gorun tags lines, "[3] text", or without tag as "text";
// other lines are returned as they are.
func relabelLine(line []byte, tag bool) []byte {
	i := 0
	for i < len(line) && line[i] == ' ' {
		i++
	}
	d := i
	for i < len(line) && line[i] >= '0' && line[i] <= '9' {
		i++
	}
	if i == d || i+1 >= len(line) || line[i] != ':' || line[i+1] != ' ' {
		return line
	}
	if !tag {
		return line[i+2:]
	}
	out := make([]byte, 0, len(line)+1)
	out = append(out, '[')
	out = append(out, line[d:i]...)
	out = append(out, "] "...)
	return append(out, line[i+2:]...)
}

package pmi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The two wire formats of the PMI "simple" protocol.
//
// PMI-1 (wire v1): one command per line, attributes separated by spaces:
//
//	cmd=get kvsname=kvs_1 key=addr.0\n
//
// A value ends at a space or at the end of the line; a backslash takes the
// next character literally.
//
// PMI-2 (wire v2): a command is a 6-character decimal length (space
// padded, on either side) followed by that many bytes of
// "key=value;" attributes, the first of which is cmd:
//
//	27    cmd=kvs-put;key=k;value=v;
//
// Values must not contain ';' (neither hydra nor Slurm implement an escape
// for it). Both sides of this package only ever send values of the
// alphabet [A-Za-z0-9._-] and a few fixed words, so no escaping is needed
// on the way out.

// Limits on what the decoders accept; a longer line or command is an error.
const (
	maxLine  = 64 << 10 // bytes in one v1 line or v2 command
	lenWidth = 6        // the v2 length prefix
)

var (
	// ErrProtocol: the server sent something that is not a well-formed
	// PMI message, or not the answer to the request.
	ErrProtocol = errors.New("pmi: protocol error")
)

// attr is one key=value attribute; a key without "=" has an empty value
// and noValue set.
type attr struct {
	key, value string
	noValue    bool
}

// msg is one decoded PMI command or response.
type msg struct {
	cmd   string
	attrs []attr
}

// get returns the value of the first attribute named key.
func (m *msg) get(key string) (string, bool) {
	for _, a := range m.attrs {
		if a.key == key {
			return a.value, true
		}
	}
	return "", false
}

// getInt returns the integer value of attribute key.
func (m *msg) getInt(key string) (int, error) {
	v, ok := m.get(key)
	if !ok {
		return 0, fmt.Errorf("%w: %s has no %s", ErrProtocol, m.cmd, key)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %s=%q is not an integer", ErrProtocol, m.cmd, key, v)
	}
	return n, nil
}

// rcErr returns the error a non-zero rc attribute reports (with msg or
// errmsg), or nil when rc is absent or zero.
func (m *msg) rcErr() error {
	v, ok := m.get("rc")
	if !ok || v == "0" {
		return nil
	}
	why, _ := m.get("msg")
	if why == "" {
		why, _ = m.get("errmsg")
	}
	return &ServerError{Cmd: m.cmd, RC: v, Msg: why}
}

// ServerError is a PMI response with a non-zero rc.
type ServerError struct {
	Cmd, RC, Msg string
}

func (e *ServerError) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("pmi: %s: rc=%s", e.Cmd, e.RC)
	}
	return fmt.Sprintf("pmi: %s: rc=%s: %s", e.Cmd, e.RC, e.Msg)
}

// isKeyChar reports whether c may appear in an attribute name.
func isKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '/' || c == '.'
}

// checkWord reports an error when s cannot be sent as a key (isKey) or
// value without escaping: empty keys, keys outside the key alphabet, and
// values with spaces, controls, backslashes, ';' or non-ASCII bytes.
func checkWord(s string, isKey bool) error {
	if isKey && s == "" {
		return errors.New("pmi: empty key")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isKey && !isKeyChar(c) || c < 0x21 || c > 0x7e || c == '\\' || c == ';' {
			return fmt.Errorf("pmi: %q: byte %#x cannot be sent", clip(s), c)
		}
	}
	return nil
}

// checkCmd accepts a command name: a non-empty word of the key alphabet.
func checkCmd(cmd string) error {
	if cmd == "" {
		return fmt.Errorf("%w: empty cmd", ErrProtocol)
	}
	for i := 0; i < len(cmd); i++ {
		if !isKeyChar(cmd[i]) {
			return fmt.Errorf("%w: bad cmd %q", ErrProtocol, clip(cmd))
		}
	}
	return nil
}

// appendV1 appends the v1 encoding of cmd and its key/value pairs
// (kv alternates keys and values), with the final newline.
func appendV1(b []byte, cmd string, kv ...string) ([]byte, error) {
	if len(kv)%2 != 0 {
		panic("pmi: appendV1 needs key/value pairs")
	}
	b = append(b, "cmd="...)
	b = append(b, cmd...)
	for i := 0; i < len(kv); i += 2 {
		if err := checkWord(kv[i], true); err != nil {
			return nil, err
		}
		if err := checkWord(kv[i+1], false); err != nil {
			return nil, err
		}
		b = append(b, ' ')
		b = append(b, kv[i]...)
		b = append(b, '=')
		b = append(b, kv[i+1]...)
	}
	return append(b, '\n'), nil
}

// decodeV1 decodes one v1 line (without its newline).
func decodeV1(line []byte) (msg, error) {
	var m msg
	if len(line) > maxLine {
		return m, fmt.Errorf("%w: line of %d bytes", ErrProtocol, len(line))
	}
	s := string(line)
	if !strings.HasPrefix(s, "cmd=") {
		return m, fmt.Errorf("%w: line %q does not start with cmd=", ErrProtocol, clip(s))
	}
	i := 0
	first := true
	for {
		for i < len(s) && s[i] == ' ' {
			i++
		}
		if i == len(s) {
			break
		}
		k := i
		for i < len(s) && isKeyChar(s[i]) {
			i++
		}
		if i == k {
			return m, fmt.Errorf("%w: line %q: bad character %q at %d", ErrProtocol, clip(s), s[i], i)
		}
		a := attr{key: s[k:i]}
		switch {
		case i == len(s) || s[i] == ' ':
			a.noValue = true
		case s[i] == '=':
			i++
			var v strings.Builder
			for i < len(s) && s[i] != ' ' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				v.WriteByte(s[i])
				i++
			}
			a.value = v.String()
		default:
			return m, fmt.Errorf("%w: line %q: bad character %q after key", ErrProtocol, clip(s), s[i])
		}
		if first {
			m.cmd = a.value
			first = false
			if err := checkCmd(m.cmd); err != nil {
				return m, err
			}
			continue
		}
		m.attrs = append(m.attrs, a)
	}
	return m, nil
}

// appendV2 appends the v2 encoding (length prefix included) of cmd and its
// key/value pairs.
func appendV2(b []byte, cmd string, kv ...string) ([]byte, error) {
	if len(kv)%2 != 0 {
		panic("pmi: appendV2 needs key/value pairs")
	}
	start := len(b)
	b = append(b, "      cmd="...)
	b = append(b, cmd...)
	b = append(b, ';')
	for i := 0; i < len(kv); i += 2 {
		if err := checkWord(kv[i], true); err != nil {
			return nil, err
		}
		if err := checkWord(kv[i+1], false); err != nil {
			return nil, err
		}
		b = append(b, kv[i]...)
		b = append(b, '=')
		b = append(b, kv[i+1]...)
		b = append(b, ';')
	}
	n := len(b) - start - lenWidth
	if n >= 1e6 {
		return nil, fmt.Errorf("pmi: command of %d bytes is too long", n)
	}
	copy(b[start:start+lenWidth], fmt.Sprintf("%-6d", n))
	return b, nil
}

// parseV2Len decodes a v2 length prefix: a decimal number padded with
// spaces on either side.
func parseV2Len(p []byte) (int, error) {
	s := strings.TrimSpace(string(p))
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxLine || s[0] == '+' || s[0] == '-' {
		return 0, fmt.Errorf("%w: bad length prefix %q", ErrProtocol, p)
	}
	return n, nil
}

// decodeV2 decodes the body of one v2 command (after its length prefix).
func decodeV2(body []byte) (msg, error) {
	var m msg
	if len(body) > maxLine {
		return m, fmt.Errorf("%w: command of %d bytes", ErrProtocol, len(body))
	}
	s := string(body)
	if !strings.HasPrefix(s, "cmd=") {
		return m, fmt.Errorf("%w: command %q does not start with cmd=", ErrProtocol, clip(s))
	}
	first := true
	for _, part := range strings.Split(s, ";") {
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if k == "" {
			return m, fmt.Errorf("%w: command %q: empty key", ErrProtocol, clip(s))
		}
		for i := 0; i < len(k); i++ {
			if !isKeyChar(k[i]) {
				return m, fmt.Errorf("%w: command %q: bad key %q", ErrProtocol, clip(s), clip(k))
			}
		}
		if first {
			if err := checkCmd(v); err != nil {
				return m, err
			}
			m.cmd, first = v, false
			continue
		}
		m.attrs = append(m.attrs, attr{key: k, value: v, noValue: !ok})
	}
	return m, nil
}

// readV1 reads one v1 line from r.
func readV1(r *bufio.Reader) (msg, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > maxLine+1 {
			return msg{}, fmt.Errorf("%w: line longer than %d bytes", ErrProtocol, maxLine)
		}
		switch {
		case err == nil:
			return decodeV1(line[:len(line)-1])
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(line) > 0:
			return msg{}, io.ErrUnexpectedEOF
		default:
			return msg{}, err
		}
	}
}

// readV2 reads one v2 command from r.
func readV2(r *bufio.Reader) (msg, error) {
	var hdr [lenWidth]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return msg{}, err
	}
	n, err := parseV2Len(hdr[:])
	if err != nil {
		return msg{}, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return msg{}, err
	}
	return decodeV2(body)
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

package pmi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The environment a PMI process manager gives its processes.
const (
	EnvFD      = "PMI_FD"    // descriptor of a connected socket to the server (hydra, Slurm)
	EnvPort    = "PMI_PORT"  // host:port of the server, with PMI_ID (hydra -pmi-port)
	EnvID      = "PMI_ID"    // the process's id for the initack handshake on PMI_PORT
	EnvRank    = "PMI_RANK"  // rank, with PMI_FD
	EnvSize    = "PMI_SIZE"  // size, with PMI_FD
	EnvJobID   = "PMI_JOBID" // PMI-2 job id (Slurm)
	EnvVersion = "GOMPI_PMI" // "1" or "2": the PMI version to speak (default: 2 when PMI_JOBID is set)
)

// ErrBroken: an earlier request was abandoned halfway (its context ended
// or the connection failed), so the connection is out of step and unusable.
var ErrBroken = errors.New("pmi: connection unusable after an abandoned request")

// Detect reports whether the environment names a PMI server.
func Detect(getenv func(string) string) bool {
	return getenv(EnvFD) != "" || getenv(EnvPort) != ""
}

// Client is one process's connection to the PMI server of its job
// (hydra's proxy, slurmstepd). Requests are serialized: PMI answers one
// request at a time, in order. All methods are safe for concurrent use.
type Client struct {
	v2          bool
	rank, size  int
	appnum      int
	kvs         string // PMI-1 kvsname, PMI-2 jobid
	keyMax      int    // longest key the server accepts
	valMax      int    // longest value the server accepts
	conn        net.Conn
	file        *os.File // when the descriptor is not a socket
	rw          io.ReadWriter
	r           *bufio.Reader
	mu          sync.Mutex // serializes requests; guards broken, done
	broken      bool
	done        bool // Finalize or Abort sent
	setDeadline func(time.Time) error
}

// Dial connects to the PMI server named by the environment (getenv) and
// performs the init handshake: PMI-1 (init, get_maxes, get_appnum,
// get_my_kvsname) or PMI-2 (init, fullinit, job-getid). The version is
// GOMPI_PMI when set, else 2 when PMI_JOBID is set (Slurm's pmi2 plugin),
// else 1. ctx bounds the handshake.
func Dial(ctx context.Context, getenv func(string) string) (*Client, error) {
	c := &Client{keyMax: 64, valMax: 1024, appnum: -1}
	switch getenv(EnvVersion) {
	case "1":
	case "2":
		c.v2 = true
	case "":
		c.v2 = getenv(EnvJobID) != ""
	default:
		return nil, fmt.Errorf("pmi: %s=%q: want 1 or 2", EnvVersion, getenv(EnvVersion))
	}
	byPort := false
	if fd := getenv(EnvFD); fd != "" {
		n, err := strconv.Atoi(fd)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("pmi: %s=%q is not a descriptor", EnvFD, fd)
		}
		if err := c.useFD(n); err != nil {
			return nil, err
		}
	} else if addr := getenv(EnvPort); addr != "" {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("pmi: connect to %s=%s: %w", EnvPort, addr, err)
		}
		c.setConn(conn)
		byPort = true
	} else {
		return nil, fmt.Errorf("pmi: neither %s nor %s is set", EnvFD, EnvPort)
	}
	if err := c.init(ctx, getenv, byPort); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// New runs the init handshake over an already connected stream (a test's
// fake server, or a socket a caller opened); getenv supplies PMI_RANK,
// PMI_SIZE, PMI_ID and PMI_JOBID as Dial reads them.
func New(ctx context.Context, conn net.Conn, v2 bool, byPort bool, getenv func(string) string) (*Client, error) {
	c := &Client{keyMax: 64, valMax: 1024, appnum: -1, v2: v2}
	c.setConn(conn)
	if err := c.init(ctx, getenv, byPort); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) setConn(conn net.Conn) {
	c.conn, c.rw, c.setDeadline = conn, conn, conn.SetDeadline
	c.r = bufio.NewReaderSize(conn, 4096)
}

// useFD takes over descriptor fd: as a net.Conn when it is a socket, else
// as a file.
func (c *Client) useFD(fd int) error {
	f := os.NewFile(uintptr(fd), "pmi")
	if f == nil {
		return fmt.Errorf("pmi: %s=%d is not open", EnvFD, fd)
	}
	if conn, err := net.FileConn(f); err == nil {
		f.Close() // FileConn made its own copy of the descriptor
		c.setConn(conn)
		return nil
	}
	c.file, c.rw, c.setDeadline = f, f, f.SetDeadline
	c.r = bufio.NewReaderSize(f, 4096)
	return nil
}

func (c *Client) init(ctx context.Context, getenv func(string) string, byPort bool) error {
	if byPort {
		// hydra -pmi-port: the id identifies the process; the server
		// answers initack and then three "set" lines.
		id := getenv(EnvID)
		if _, err := strconv.Atoi(id); err != nil {
			return fmt.Errorf("pmi: %s=%q is not a number", EnvID, id)
		}
		if _, err := c.request(ctx, false, "initack", "initack", "pmiid", id); err != nil {
			return err
		}
		got := map[string]string{}
		for len(got) < 3 {
			m, err := c.readLocked(ctx, false)
			if err != nil {
				return fmt.Errorf("pmi: initack: %w", err)
			}
			if m.cmd != "set" || len(m.attrs) != 1 {
				return fmt.Errorf("%w: initack: unexpected cmd=%s", ErrProtocol, m.cmd)
			}
			got[m.attrs[0].key] = m.attrs[0].value
		}
		var err1, err2 error
		c.rank, err1 = strconv.Atoi(got["rank"])
		c.size, err2 = strconv.Atoi(got["size"])
		if err1 != nil || err2 != nil {
			return fmt.Errorf("%w: initack gave rank %q size %q", ErrProtocol, got["rank"], got["size"])
		}
	} else {
		var err1, err2 error
		c.rank, err1 = strconv.Atoi(getenv(EnvRank))
		c.size, err2 = strconv.Atoi(getenv(EnvSize))
		if err1 != nil || err2 != nil {
			return fmt.Errorf("pmi: %s=%q %s=%q are not numbers", EnvRank, getenv(EnvRank), EnvSize, getenv(EnvSize))
		}
	}
	if c.rank < 0 || c.size < 1 || c.rank >= c.size {
		return fmt.Errorf("pmi: rank %d of %d", c.rank, c.size)
	}
	// The version handshake is a PMI-1 line for both versions.
	ver, sub := "1", "1"
	if c.v2 {
		ver, sub = "2", "0"
	}
	m, err := c.request(ctx, false, "init", "response_to_init", "pmi_version", ver, "pmi_subversion", sub)
	if err != nil {
		return err
	}
	if v, _ := m.get("pmi_version"); v != ver {
		return fmt.Errorf("pmi: the server speaks PMI version %q, not %s", v, ver)
	}
	if c.v2 {
		return c.initV2(ctx, getenv)
	}
	return c.initV1(ctx)
}

func (c *Client) initV1(ctx context.Context) error {
	m, err := c.request(ctx, false, "get_maxes", "maxes")
	if err != nil {
		return err
	}
	if c.keyMax, err = m.getInt("keylen_max"); err != nil {
		return err
	}
	if c.valMax, err = m.getInt("vallen_max"); err != nil {
		return err
	}
	if m, err = c.request(ctx, false, "get_appnum", "appnum"); err != nil {
		return err
	}
	if c.appnum, err = m.getInt("appnum"); err != nil {
		return err
	}
	if m, err = c.request(ctx, false, "get_my_kvsname", "my_kvsname"); err != nil {
		return err
	}
	c.kvs, _ = m.get("kvsname")
	if c.kvs == "" {
		return fmt.Errorf("%w: empty kvsname", ErrProtocol)
	}
	return checkWord(c.kvs, false)
}

func (c *Client) initV2(ctx context.Context, getenv func(string) string) error {
	kv := []string{"pmirank", strconv.Itoa(c.rank), "threaded", "FALSE"}
	if id := getenv(EnvJobID); id != "" {
		kv = append([]string{"pmijobid", id}, kv...)
	}
	m, err := c.request(ctx, true, "fullinit", "fullinit-response", kv...)
	if err != nil {
		return err
	}
	rank, err := m.getInt("rank")
	if err != nil {
		return err
	}
	size, err := m.getInt("size")
	if err != nil {
		return err
	}
	if rank != c.rank || size != c.size {
		return fmt.Errorf("%w: fullinit says rank %d of %d, the environment %d of %d", ErrProtocol, rank, size, c.rank, c.size)
	}
	if v, ok := m.get("appnum"); ok {
		c.appnum, _ = strconv.Atoi(v)
	}
	if m, err = c.request(ctx, true, "job-getid", "job-getid-response"); err != nil {
		return err
	}
	c.kvs, _ = m.get("jobid")
	if c.kvs == "" {
		c.kvs = getenv(EnvJobID)
	}
	// PMI-2 has no get_maxes; 1024 is PMI2_MAX_VALLEN, 64 its key length.
	c.keyMax, c.valMax = 64, 1024
	return nil
}

// Rank and Size are this process's place in the job.
func (c *Client) Rank() int { return c.rank }
func (c *Client) Size() int { return c.size }

// AppNum is the application number (0 for the first command of an MPMD
// launch), -1 when the server did not say.
func (c *Client) AppNum() int { return c.appnum }

// KVSName is the job's key-value space name (PMI-1 kvsname, PMI-2 jobid).
func (c *Client) KVSName() string { return c.kvs }

// Version is 1 or 2.
func (c *Client) Version() int {
	if c.v2 {
		return 2
	}
	return 1
}

// MaxKey and MaxValue are the longest key and value Put accepts.
func (c *Client) MaxKey() int   { return c.keyMax }
func (c *Client) MaxValue() int { return c.valMax }

// Put stores key=value in the job's key-value space; other processes see
// it after the next Fence. key must be of the alphabet [A-Za-z0-9._-/]
// and value printable ASCII without spaces, '\\' or ';'; their lengths at
// most MaxKey and MaxValue.
func (c *Client) Put(ctx context.Context, key, value string) error {
	if len(key) > c.keyMax || len(value) > c.valMax {
		return fmt.Errorf("pmi: put %q: key of %d bytes (max %d), value of %d (max %d)", clip(key), len(key), c.keyMax, len(value), c.valMax)
	}
	if value == "" {
		return fmt.Errorf("pmi: put %q: empty value", clip(key))
	}
	var err error
	if c.v2 {
		_, err = c.request(ctx, true, "kvs-put", "kvs-put-response", "key", key, "value", value)
	} else {
		_, err = c.request(ctx, false, "put", "put_result", "kvsname", c.kvs, "key", key, "value", value)
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// Fence waits until every process of the job called Fence (PMI-1
// barrier, PMI-2 kvs-fence); then every Put made before it is visible to
// every process. It blocks until the job's last process arrives or ctx
// ends; an ended ctx leaves the connection unusable (ErrBroken).
func (c *Client) Fence(ctx context.Context) error {
	var err error
	if c.v2 {
		_, err = c.request(ctx, true, "kvs-fence", "kvs-fence-response")
	} else {
		_, err = c.request(ctx, false, "barrier_in", "barrier_out")
	}
	if err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	return nil
}

// Get returns the value of key in the job's key-value space, and whether
// it exists. A key that is not there (yet) is found=false, not an error.
func (c *Client) Get(ctx context.Context, key string) (value string, found bool, err error) {
	if c.v2 {
		m, err := c.request(ctx, true, "kvs-get", "kvs-get-response", "jobid", c.kvs, "key", key)
		if err != nil {
			return "", false, fmt.Errorf("get %s: %w", key, err)
		}
		return v2Found(m)
	}
	m, err := c.requestRC(ctx, false, "get", "get_result", "kvsname", c.kvs, "key", key)
	if err != nil {
		return "", false, fmt.Errorf("get %s: %w", key, err)
	}
	if m.rcErr() != nil {
		// hydra and Slurm answer a missing key with a non-zero rc.
		return "", false, nil
	}
	v, ok := m.get("value")
	if !ok {
		return "", false, fmt.Errorf("get %s: %w: get_result without value", key, ErrProtocol)
	}
	return v, true, nil
}

// JobAttr returns a job attribute the process manager sets, such as
// PMI_process_mapping: a PMI-2 info-getjobattr, or with PMI-1 a get from
// the job's key-value space, where hydra and Slurm put them before start.
func (c *Client) JobAttr(ctx context.Context, key string) (string, bool, error) {
	if !c.v2 {
		return c.Get(ctx, key)
	}
	m, err := c.request(ctx, true, "info-getjobattr", "info-getjobattr-response", "key", key)
	if err != nil {
		return "", false, fmt.Errorf("job attribute %s: %w", key, err)
	}
	return v2Found(m)
}

func v2Found(m msg) (string, bool, error) {
	f, _ := m.get("found")
	if !strings.EqualFold(f, "TRUE") {
		return "", false, nil
	}
	v, ok := m.get("value")
	if !ok {
		return "", false, fmt.Errorf("%w: %s found without value", ErrProtocol, m.cmd)
	}
	return v, true, nil
}

// Abort asks the process manager to end the whole job with exit status
// code, reporting msg. It does not wait for an answer (the server kills
// the job); the caller exits after it.
func (c *Client) Abort(code int, text string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken || c.done {
		return ErrBroken
	}
	c.done = true
	text = sanitize(text)
	var b []byte
	var err error
	if c.v2 {
		b, err = appendV2(nil, "abort", "isworld", "TRUE", "msg", text)
	} else {
		b, err = appendV1(nil, "abort", "exitcode", strconv.Itoa(code), "message", text)
	}
	if err != nil {
		return err
	}
	c.setDeadline(time.Now().Add(5 * time.Second))
	_, err = c.rw.Write(b)
	return err
}

// Finalize tells the process manager that this process leaves the job
// cleanly, and waits for its acknowledgement. Later requests fail.
func (c *Client) Finalize(ctx context.Context) error {
	var err error
	if c.v2 {
		_, err = c.request(ctx, true, "finalize", "finalize-response")
	} else {
		_, err = c.request(ctx, false, "finalize", "finalize_ack")
	}
	c.mu.Lock()
	c.done = true
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	return nil
}

// Close closes the connection. A process that closes it without Finalize
// is taken by hydra and Slurm as failed.
func (c *Client) Close() error {
	if c.conn != nil {
		return c.conn.Close()
	}
	if c.file != nil {
		return c.file.Close()
	}
	return nil
}

// request sends cmd and returns the answer, which must be cmd want with
// rc absent or zero.
func (c *Client) request(ctx context.Context, v2 bool, cmd, want string, kv ...string) (msg, error) {
	m, err := c.requestRC(ctx, v2, cmd, want, kv...)
	if err != nil {
		return m, err
	}
	return m, m.rcErr()
}

// requestRC is request without the rc check.
func (c *Client) requestRC(ctx context.Context, v2 bool, cmd, want string, kv ...string) (msg, error) {
	var b []byte
	var err error
	if v2 {
		b, err = appendV2(nil, cmd, kv...)
	} else {
		b, err = appendV1(nil, cmd, kv...)
	}
	if err != nil {
		return msg{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken {
		return msg{}, ErrBroken
	}
	if c.done && cmd != "finalize" {
		return msg{}, errors.New("pmi: request after Finalize or Abort")
	}
	stop := c.watch(ctx)
	_, err = c.rw.Write(b)
	var m msg
	if err == nil {
		m, err = c.read(v2)
	}
	stop()
	if err != nil {
		c.broken = true
		if ctx.Err() != nil {
			return m, fmt.Errorf("pmi %s: %w", cmd, context.Cause(ctx))
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return m, fmt.Errorf("pmi %s: %w", cmd, err)
	}
	if m.cmd != want {
		c.broken = true
		return m, fmt.Errorf("%w: %s answered with cmd=%s, want %s", ErrProtocol, cmd, m.cmd, want)
	}
	return m, nil
}

// readLocked reads one unsolicited message (initack's set lines); c.mu
// need not be held during Dial.
func (c *Client) readLocked(ctx context.Context, v2 bool) (msg, error) {
	stop := c.watch(ctx)
	defer stop()
	m, err := c.read(v2)
	if err != nil {
		c.broken = true
	}
	return m, err
}

func (c *Client) read(v2 bool) (msg, error) {
	if v2 {
		return readV2(c.r)
	}
	return readV1(c.r)
}

// watch makes the connection's I/O fail when ctx ends; stop ends the watch
// and clears the deadline.
func (c *Client) watch(ctx context.Context) (stop func()) {
	if ctx.Done() == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case <-ctx.Done():
			c.setDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	return func() {
		close(done)
		<-finished
		c.setDeadline(time.Time{})
	}
}

// sanitize makes text sendable as one PMI value: bytes that cannot be
// sent become '_'.
func sanitize(text string) string {
	b := []byte(text)
	for i, c := range b {
		if c < 0x21 || c > 0x7e || c == '\\' || c == ';' {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	if len(b) > 512 {
		b = b[:512]
	}
	return string(b)
}

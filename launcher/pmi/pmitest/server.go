// Package pmitest is an in-process PMI server for tests: it speaks the
// server side of PMI-1 and PMI-2 (as hydra's proxy and Slurm's stepd do)
// to any number of clients over in-memory connections, with a key-value
// space whose puts become visible at the next fence, as with a real
// process manager.
//
// Usage:
//
//	srv := pmitest.NewServer(4)
//	defer srv.Close()
//	conn := srv.Conn(rank)           // the client's end
//	c, err := pmi.New(ctx, conn, v2, false, srv.Env(rank))
package pmitest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
)

// Server is a fake PMI process manager for one job.
type Server struct {
	size int
	// Mapping is the PMI_process_mapping job attribute ("" for none);
	// KeyMax and ValMax what get_maxes reports. Set them before Conn.
	Mapping        string
	KeyMax, ValMax int

	mu        sync.Mutex
	cond      *sync.Cond
	kvs       map[string]string // visible to gets
	staged    map[string]string // put since the last fence
	arrived   int               // ranks in the current fence
	gen       int               // completed fences
	aborts    []string
	finalized map[int]bool
	closed    bool
	conns     []net.Conn
	wg        sync.WaitGroup
}

// NewServer makes a server for a job of size ranks on one node.
func NewServer(size int) *Server {
	s := &Server{size: size, KeyMax: 64, ValMax: 1024,
		Mapping: fmt.Sprintf("(vector,(0,1,%d))", size),
		kvs:     map[string]string{}, staged: map[string]string{}, finalized: map[int]bool{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Env returns the environment of rank (PMI_RANK, PMI_SIZE, PMI_JOBID).
func (s *Server) Env(rank int) func(string) string {
	return func(k string) string {
		switch k {
		case "PMI_RANK":
			return strconv.Itoa(rank)
		case "PMI_SIZE":
			return strconv.Itoa(s.size)
		case "PMI_JOBID":
			return "job1"
		}
		return ""
	}
}

// Conn returns the client end of a new connection for rank; the server
// serves the other end until the client closes it or Close.
func (s *Server) Conn(rank int) net.Conn {
	a, b := net.Pipe()
	s.mu.Lock()
	s.conns = append(s.conns, b)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer b.Close()
		s.serve(rank, b)
	}()
	return a
}

// Aborts returns the abort messages received so far.
func (s *Server) Aborts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.aborts...)
}

// Finalized reports whether rank sent finalize.
func (s *Server) Finalized(rank int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finalized[rank]
}

// Close ends every connection (fences in progress fail) and waits for the
// serving goroutines.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, c := range s.conns {
		c.Close()
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wg.Wait()
}

// fence waits until every rank arrived; it returns false when the server
// closed first.
func (s *Server) fence() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	gen := s.gen
	s.arrived++
	if s.arrived == s.size {
		for k, v := range s.staged {
			s.kvs[k] = v
		}
		clear(s.staged)
		s.arrived = 0
		s.gen++
		s.cond.Broadcast()
	}
	for s.gen == gen && !s.closed {
		s.cond.Wait()
	}
	return s.gen != gen
}

func (s *Server) put(k, v string) {
	s.mu.Lock()
	s.staged[k] = v
	s.mu.Unlock()
}

func (s *Server) get(k string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k == "PMI_process_mapping" && s.Mapping != "" {
		return s.Mapping, true
	}
	v, ok := s.kvs[k]
	return v, ok
}

// attrs splits "k=v" words.
func attrs(words []string) map[string]string {
	m := map[string]string{}
	for _, w := range words {
		k, v, _ := strings.Cut(w, "=")
		if _, dup := m[k]; !dup {
			m[k] = v
		}
	}
	return m
}

func (s *Server) serve(rank int, c net.Conn) {
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	a := attrs(strings.Fields(line))
	if a["cmd"] == "initack" {
		fmt.Fprintf(c, "cmd=initack\ncmd=set size=%d\ncmd=set rank=%d\ncmd=set debug=0\n", s.size, rank)
		if line, err = r.ReadString('\n'); err != nil {
			return
		}
		a = attrs(strings.Fields(line))
	}
	if a["cmd"] != "init" {
		return
	}
	v := a["pmi_version"]
	fmt.Fprintf(c, "cmd=response_to_init pmi_version=%s pmi_subversion=%s rc=0\n", v, a["pmi_subversion"])
	if v == "2" {
		s.serveV2(rank, r, c)
		return
	}
	s.serveV1(rank, r, c)
}

func (s *Server) serveV1(rank int, r *bufio.Reader, c net.Conn) {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		a := attrs(strings.Fields(line))
		var out string
		switch a["cmd"] {
		case "get_maxes":
			out = fmt.Sprintf("cmd=maxes kvsname_max=256 keylen_max=%d vallen_max=%d", s.KeyMax, s.ValMax)
		case "get_appnum":
			out = "cmd=appnum appnum=0"
		case "get_my_kvsname":
			out = "cmd=my_kvsname kvsname=kvs_test_0"
		case "put":
			if len(a["key"]) > s.KeyMax || len(a["value"]) > s.ValMax {
				out = "cmd=put_result rc=-1 msg=too_long"
				break
			}
			s.put(a["key"], a["value"])
			out = "cmd=put_result rc=0 msg=success"
		case "get":
			if v, ok := s.get(a["key"]); ok {
				out = "cmd=get_result rc=0 msg=success value=" + v
			} else {
				out = "cmd=get_result rc=-1 msg=key_" + a["key"] + "_not_found value=unknown"
			}
		case "barrier_in":
			if !s.fence() {
				return
			}
			out = "cmd=barrier_out"
		case "finalize":
			s.mu.Lock()
			s.finalized[rank] = true
			s.mu.Unlock()
			out = "cmd=finalize_ack"
		case "abort":
			s.mu.Lock()
			s.aborts = append(s.aborts, fmt.Sprintf("rank %d exitcode %s: %s", rank, a["exitcode"], a["message"]))
			s.mu.Unlock()
			return
		default:
			out = "cmd=" + a["cmd"] + "_result rc=-1 msg=unknown_command"
		}
		if _, err := io.WriteString(c, out+"\n"); err != nil {
			return
		}
	}
}

func (s *Server) serveV2(rank int, r *bufio.Reader, c net.Conn) {
	for {
		var hdr [6]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(hdr[:])))
		if err != nil || n < 0 || n > 1<<20 {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		a := attrs(strings.Split(strings.TrimSuffix(string(body), ";"), ";"))
		var out string
		switch a["cmd"] {
		case "fullinit":
			out = fmt.Sprintf("cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=%d;size=%d;appnum=0;debugged=FALSE;pmiverbose=FALSE;rc=0;", rank, s.size)
		case "job-getid":
			out = "cmd=job-getid-response;jobid=job1;rc=0;"
		case "kvs-put":
			s.put(a["key"], a["value"])
			out = "cmd=kvs-put-response;rc=0;"
		case "kvs-get", "info-getjobattr":
			if v, ok := s.get(a["key"]); ok {
				out = "cmd=" + a["cmd"] + "-response;found=TRUE;value=" + v + ";rc=0;"
			} else {
				out = "cmd=" + a["cmd"] + "-response;found=FALSE;rc=0;"
			}
		case "kvs-fence":
			if !s.fence() {
				return
			}
			out = "cmd=kvs-fence-response;rc=0;"
		case "finalize":
			s.mu.Lock()
			s.finalized[rank] = true
			s.mu.Unlock()
			out = "cmd=finalize-response;rc=0;"
		case "abort":
			s.mu.Lock()
			s.aborts = append(s.aborts, fmt.Sprintf("rank %d: %s", rank, a["msg"]))
			s.mu.Unlock()
			return
		default:
			out = "cmd=" + a["cmd"] + "-response;rc=1;errmsg=unknown;"
		}
		if _, err := fmt.Fprintf(c, "%6d%s", len(out), out); err != nil {
			return
		}
	}
}

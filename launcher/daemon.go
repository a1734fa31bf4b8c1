package launcher

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A job on several hosts (Config.Hosts): gorun serves the store on every
// address of its host and starts one gorun daemon per host through the
// launch agent ("ssh HOST gorun --daemon", or any command that runs its
// arguments on HOST). The daemon reads its part of the job as one JSON
// line on its standard input, starts its ranks, writes their output
// labelled "RANK: " on its own stdout and stderr (gorun relabels or strips
// the labels), and then takes control lines on its standard input:
// "signal N" forwards signal N to its ranks. The daemon of rank 0's host
// fetches gorun's standard input for rank 0 over a connection of its own
// (stdin.go). When its standard input ends (gorun died, or the connection
// to the host broke) it stops its ranks and exits. When one of its ranks fails it says so on stderr, stops the
// others and exits with that rank's status (128+n for signal n).

// DaemonFlag is the first argument that makes gorun a host daemon
// (RunDaemon).
const DaemonFlag = "--daemon"

// DefaultAgent is the launch agent when Config.Agent is empty.
const DefaultAgent = "ssh"

// daemonConfig is a daemon's part of the job.
type daemonConfig struct {
	Host    string   `json:"host"`
	Ranks   []int    `json:"ranks"`
	Env     []string `json:"env"` // added to the daemon's environment for every rank
	Program string   `json:"program"`
	Args    []string `json:"args"`
	Stores  []string `json:"stores"` // the store's addresses, tried in order
	Grace   int64    `json:"grace"`  // nanoseconds between SIGTERM and SIGKILL
	Verbose bool     `json:"verbose"`
	// Rank 0's standard input (stdin.go): where gorun relays it and the
	// token to show; empty for the other hosts and without input.
	StdinAddrs []string `json:"stdinAddrs,omitempty"`
	StdinToken string   `json:"stdinToken,omitempty"`
}

// startDaemons starts one daemon per host that has ranks. in, if not nil,
// relays the job's standard input to the daemon of rank 0's host.
func (j *job) startDaemons(path string, env []string, hostRanks [][]int, stores []string, in *stdinRelay) error {
	self := j.cfg.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return err
		}
	}
	agent := strings.Fields(j.cfg.Agent)
	if len(agent) == 0 {
		agent = []string{DefaultAgent}
	}
	for i, h := range j.cfg.Hosts {
		if len(hostRanks[i]) == 0 {
			continue
		}
		dc := daemonConfig{Host: h.Name, Ranks: hostRanks[i], Env: env, Program: path, Args: j.cfg.Args,
			Stores: stores, Grace: int64(j.cfg.Grace), Verbose: j.cfg.Verbose}
		if in != nil && slices.Contains(dc.Ranks, 0) {
			addrs, err := in.addrs()
			if err != nil {
				return fmt.Errorf("standard input relay: %w", err)
			}
			dc.StdinAddrs, dc.StdinToken = addrs, in.token
		}
		line, err := json.Marshal(dc)
		if err != nil {
			return err
		}
		args := append(append(append([]string{}, agent[1:]...), h.Name), self, DaemonFlag)
		cmd := exec.Command(agent[0], args...)
		cmd.Env = os.Environ()
		in, ctl, err := os.Pipe()
		if err != nil {
			return err
		}
		cmd.Stdin = in
		err = j.startProc(cmd, hostRanks[i], "gorun daemon on host "+h.Name, false)
		in.Close()
		if err != nil {
			ctl.Close()
			return fmt.Errorf("host %s: %w", h.Name, err)
		}
		rk := j.ranks[len(j.ranks)-1]
		rk.ctl = ctl
		// The config is far below a pipe's capacity: the write does not
		// wait for the agent. An agent that already failed (EPIPE) is
		// reported with its exit status when it is reaped.
		ctl.Write(append(line, '\n'))
	}
	return nil
}

// RunDaemon is gorun's host daemon (gorun --daemon): it reads its part of
// the job from stdin and runs it as described above. It returns the
// daemon's exit status.
func RunDaemon(stdin io.Reader, stdout, stderr io.Writer) int {
	say := func(format string, a ...any) { fmt.Fprintf(stderr, "gorun daemon: "+format+"\n", a...) }
	br := bufio.NewReader(stdin)
	line, err := br.ReadBytes('\n')
	if err != nil {
		say("reading the job: %v", err)
		return ExitFailure
	}
	var dc daemonConfig
	if err := json.Unmarshal(line, &dc); err != nil || len(dc.Ranks) == 0 {
		say("bad job description: %v", err)
		return ExitFailure
	}
	host, _ := os.Hostname()
	say = func(format string, a ...any) {
		fmt.Fprintf(stderr, "gorun daemon on host %s (%s): "+format+"\n", append([]any{dc.Host, host}, a...)...)
	}
	store, err := reachStore(dc.Stores)
	if err != nil {
		say("%v", err)
		return ExitFailure
	}
	if dc.Verbose {
		say("ranks %s, store at %s", rangeString(dc.Ranks), store)
	}
	out := newOutput(stdout, stderr, true)
	out.label = true
	base := baseEnv(os.Environ(), dc.Env)
	type proc struct {
		cmd  *exec.Cmd
		rank int
		done chan struct{} // output forwarders finished
	}
	exits := make(chan int, len(dc.Ranks))
	procs := make([]*proc, 0, len(dc.Ranks))
	signalAll := func(sig syscall.Signal) {
		for _, p := range procs {
			if p.cmd.ProcessState == nil {
				signalGroup(p.cmd.Process.Pid, sig)
			}
		}
	}
	var rank0In *os.File // rank 0's standard input; the other ranks read /dev/null
	if dc.StdinToken != "" && slices.Contains(dc.Ranks, 0) {
		if rank0In, err = dialStdin(dc.StdinAddrs, dc.StdinToken); err != nil {
			say("rank 0 reads no standard input: %v", err)
		}
	}
	for l, r := range dc.Ranks {
		cmd := exec.Command(dc.Program, dc.Args...)
		cmd.Env = append(base[:len(base):len(base)],
			EnvRank+"="+strconv.Itoa(r), EnvLocalRank+"="+strconv.Itoa(l),
			EnvLocalSize+"="+strconv.Itoa(len(dc.Ranks)), EnvStore+"="+store, EnvNode+"="+dc.Host)
		cmd.SysProcAttr = rankProcAttr()
		if r == 0 && rank0In != nil {
			cmd.Stdin = rank0In
		}
		so, err1 := cmd.StdoutPipe()
		se, err2 := cmd.StderrPipe()
		if err1 != nil || err2 != nil {
			say("pipes: %v %v", err1, err2)
			signalAll(syscall.SIGKILL)
			return ExitFailure
		}
		err := cmd.Start()
		if r == 0 && rank0In != nil {
			rank0In.Close() // rank 0 has its own descriptor of the socket
		}
		if err != nil {
			say("start rank %d: %v", r, err)
			signalAll(syscall.SIGKILL)
			return ExitFailure
		}
		p := &proc{cmd: cmd, rank: r, done: make(chan struct{}, 2)}
		procs = append(procs, p)
		go func() { out.forward(so, false, r); p.done <- struct{}{} }()
		go func() { out.forward(se, true, r); p.done <- struct{}{} }()
		i := len(procs) - 1
		go func() { waitExited(cmd.Process.Pid); exits <- i }()
	}

	ctl := make(chan string)
	go func() {
		defer close(ctl)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			ctl <- strings.TrimSpace(l)
		}
	}()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	grace := time.Duration(dc.Grace)
	if grace <= 0 {
		grace = DefaultGrace
	}
	code := 0
	alive := len(procs)
	var killC <-chan time.Time
	stopping := false
	stop := func() {
		if !stopping {
			stopping = true
			signalAll(syscall.SIGTERM)
			killC = time.After(grace)
		}
	}
	for alive > 0 {
		select {
		case i := <-exits:
			p := procs[i]
			signalGroup(p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			<-p.done
			p.cmd.Wait()
			alive--
			ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
			var why string
			var c int
			switch {
			case ws.Signaled():
				why, c = fmt.Sprintf("killed by signal %d (%v)", int(ws.Signal()), ws.Signal()), 128+int(ws.Signal())
			case ws.ExitStatus() != 0:
				why, c = fmt.Sprintf("exited with status %d", ws.ExitStatus()), ws.ExitStatus()
			}
			if why != "" && code == 0 && !stopping {
				code = c
				say("rank %d (pid %d) %s", p.rank, p.cmd.Process.Pid, why)
				stop()
			} else if dc.Verbose {
				say("rank %d (pid %d) ended: %v", p.rank, p.cmd.Process.Pid, p.cmd.ProcessState)
			}
		case l, ok := <-ctl:
			if !ok {
				// gorun is gone or the host was cut off: end the job here.
				ctl = nil
				if code == 0 {
					code = ExitFailure
				}
				stop()
				continue
			}
			if n, ok := strings.CutPrefix(l, "signal "); ok {
				if s, err := strconv.Atoi(n); err == nil && s > 0 && s < 65 {
					signalAll(syscall.Signal(s))
					if syscall.Signal(s) == syscall.SIGKILL {
						stopping = true
					}
				}
			}
		case s := <-sigs:
			signalAll(s.(syscall.Signal))
		case <-killC:
			killC = nil
			signalAll(syscall.SIGKILL)
		}
	}
	return code
}

// reachStore returns the first of addrs that accepts a connection.
func reachStore(addrs []string) (string, error) {
	var errs []string
	for _, a := range addrs {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
		cancel()
		if err == nil {
			c.Close()
			return a, nil
		}
		errs = append(errs, err.Error())
	}
	return "", fmt.Errorf("gorun's store is not reachable from here: %s", strings.Join(errs, "; "))
}

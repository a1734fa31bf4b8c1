package launcher

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Host is one host of a job on several hosts and the ranks it may run.
type Host struct {
	Name  string
	Slots int // ranks it runs before the job counts as oversubscribed
}

// ParseHosts reads a --host list: "a,b,c" is one slot on each host,
// "a:4" four on a; a name given twice adds its slots up (as Open MPI's
// mpirun counts them).
func ParseHosts(list string) ([]Host, error) {
	var hosts []Host
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, slots := item, 1
		if n, s, ok := strings.Cut(item, ":"); ok {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 {
				return nil, argErrorf("--host %q: slots of %q must be a positive number", list, n)
			}
			name, slots = n, v
		}
		if err := checkHostName(name); err != nil {
			return nil, err
		}
		hosts = addHost(hosts, name, slots)
	}
	if len(hosts) == 0 {
		return nil, argErrorf("--host %q names no host", list)
	}
	return hosts, nil
}

// ReadHostfile reads a hostfile as Open MPI writes them: one host per
// line, "name [slots=N] [max_slots=M]", '#' starting a comment; a line
// without slots= is one slot. max_slots is accepted and ignored.
func ReadHostfile(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, argErrorf("--hostfile: %v", err)
	}
	defer f.Close()
	var hosts []Host
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		name, slots := fields[0], 1
		if err := checkHostName(name); err != nil {
			return nil, argErrorf("%s:%d: %v", path, n, err)
		}
		for _, kv := range fields[1:] {
			k, v, ok := strings.Cut(kv, "=")
			switch {
			case ok && (k == "slots" || k == "count" || k == "cpu"):
				s, err := strconv.Atoi(v)
				if err != nil || s < 1 {
					return nil, argErrorf("%s:%d: %q: slots must be a positive number", path, n, kv)
				}
				slots = s
			case ok && k == "max_slots":
			default:
				return nil, argErrorf("%s:%d: %q: want slots=N or max_slots=N", path, n, kv)
			}
		}
		hosts = addHost(hosts, name, slots)
	}
	if err := sc.Err(); err != nil {
		return nil, argErrorf("--hostfile %s: %v", path, err)
	}
	if len(hosts) == 0 {
		return nil, argErrorf("--hostfile %s names no host", path)
	}
	return hosts, nil
}

func addHost(hosts []Host, name string, slots int) []Host {
	for i := range hosts {
		if hosts[i].Name == name {
			hosts[i].Slots += slots
			return hosts
		}
	}
	return append(hosts, Host{Name: name, Slots: slots})
}

// checkHostName refuses names that would be taken as options by the
// launch agent.
func checkHostName(name string) error {
	if name == "" || strings.HasPrefix(name, "-") || strings.ContainsAny(name, " \t\n'\"\\;&|$`") {
		return argErrorf("bad host name %q", name)
	}
	return nil
}

// mapRanks places np ranks on hosts by slot (host 0's slots first, then
// host 1's, ...). More ranks than slots is an error unless oversubscribe,
// which then deals the rest out round robin. It returns each host's ranks.
func mapRanks(hosts []Host, np int, oversubscribe bool) ([][]int, error) {
	total := 0
	for _, h := range hosts {
		total += h.Slots
	}
	if np > total && !oversubscribe {
		return nil, argErrorf("%d ranks but only %d slots on %d host(s) (--oversubscribe allows more)", np, total, len(hosts))
	}
	out := make([][]int, len(hosts))
	r := 0
	for i, h := range hosts {
		for s := 0; s < h.Slots && r < np; s++ {
			out[i] = append(out[i], r)
			r++
		}
	}
	for i := 0; r < np; i = (i + 1) % len(hosts) {
		out[i] = append(out[i], r)
		r++
	}
	return out, nil
}

// describeMap says which ranks run where: "a: 0-1, b: 2".
func describeMap(hosts []Host, ranks [][]int) string {
	var parts []string
	for i, h := range hosts {
		if len(ranks[i]) == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %s", h.Name, rangeString(ranks[i])))
	}
	return strings.Join(parts, ", ")
}

// rangeString writes sorted ranks compactly: "0-2,5".
func rangeString(rs []int) string {
	var b strings.Builder
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(rs[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(rs[j]))
		}
		i = j + 1
	}
	return b.String()
}

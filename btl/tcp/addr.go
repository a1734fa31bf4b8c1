package tcp

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// The address blob a rank publishes under storeKey(rank):
//
//	gompi-tcp/1 <links> <host:port>[,<host:port>...]
//
// A dialling peer tries the addresses in order.
const blobPrefix = "gompi-tcp/1"

func encodeBlob(links int, addrs []string) []byte {
	return []byte(blobPrefix + " " + strconv.Itoa(links) + " " + strings.Join(addrs, ","))
}

func decodeBlob(b []byte) (int, []string, error) {
	f := strings.Fields(string(b))
	if len(f) != 3 || f[0] != blobPrefix {
		return 0, nil, fmt.Errorf("tcp: malformed address blob %q (a different gompi version?)", b)
	}
	links, err := strconv.Atoi(f[1])
	if err != nil || links < 1 {
		return 0, nil, fmt.Errorf("tcp: malformed address blob %q", b)
	}
	addrs := strings.Split(f[2], ",")
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return 0, nil, fmt.Errorf("tcp: malformed address %q in blob: %v", a, err)
		}
	}
	return links, addrs, nil
}

// listenIPs chooses the addresses to listen on: those btl_tcp_if_include
// names (interface names, addresses, or CIDR subnets matched against the
// interfaces' addresses), else 127.0.0.1 when every rank is on this host,
// else every address of the up, non-loopback interfaces (link-local IPv6
// excluded).
//
// btl_tcp_if_exclude (the same kinds of items; not together with
// btl_tcp_if_include, as in Open MPI) takes addresses out of the default
// choice: a single-host job whose loopback is excluded listens on the
// other interfaces.
func listenIPs(env *btl.Env, include, exclude string) ([]net.IP, error) {
	include, exclude = strings.TrimSpace(include), strings.TrimSpace(exclude)
	if include != "" && exclude != "" {
		return nil, mpierr.Errorf(mpierr.ErrArg, "%s and %s exclude each other: set one", paramIfInclude, paramIfExclude)
	}
	if include == "" {
		excluded := ifaceMatcher(exclude)
		if env.LocalSize >= env.Size {
			lo, err := ifaceIPs(func(ifc net.Interface, ip net.IP) bool { return ip.Equal(net.IPv4(127, 0, 0, 1)) })
			if err != nil || len(lo) == 0 {
				// No loopback interface listed (a bare namespace): the
				// address still works when lo is up.
				lo = []net.IP{net.IPv4(127, 0, 0, 1)}
			}
			if exclude == "" || !excluded(loopbackIface(), lo[0]) {
				return lo[:1], nil
			}
		}
		ips, err := ifaceIPs(func(ifc net.Interface, ip net.IP) bool {
			return ifc.Flags&net.FlagLoopback == 0 && !ip.IsLinkLocalUnicast() && !excluded(ifc, ip)
		})
		if err == nil && len(ips) == 0 {
			err = fmt.Errorf("no up, non-loopback interface with an address left (%s=%q)", paramIfExclude, exclude)
		}
		if err != nil {
			return nil, mpierr.Errorf(mpierr.ErrNotSupported, "tcp: no interface to listen on: %v", err)
		}
		return ips, nil
	}
	var out []net.IP
	seen := map[string]bool{}
	add := func(ips ...net.IP) {
		for _, ip := range ips {
			if !seen[ip.String()] {
				seen[ip.String()] = true
				out = append(out, ip)
			}
		}
	}
	for _, item := range strings.Split(include, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if ip := net.ParseIP(item); ip != nil {
			add(ip)
			continue
		}
		var ips []net.IP
		var err error
		if _, subnet, perr := net.ParseCIDR(item); perr == nil {
			ips, err = ifaceIPs(func(_ net.Interface, ip net.IP) bool { return subnet.Contains(ip) })
		} else {
			ips, err = ifaceIPs(func(ifc net.Interface, ip net.IP) bool { return ifc.Name == item && !ip.IsLinkLocalUnicast() })
		}
		if err == nil && len(ips) == 0 {
			err = fmt.Errorf("no up interface matches")
		}
		if err != nil {
			return nil, mpierr.Errorf(mpierr.ErrArg, "%s: %q: %v", paramIfInclude, item, err)
		}
		add(ips...)
	}
	if len(out) == 0 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "%s=%q names no address", paramIfInclude, include)
	}
	return out, nil
}

// ifaceMatcher returns whether an interface's address is named by list:
// interface names, addresses or CIDR subnets, comma separated.
func ifaceMatcher(list string) func(net.Interface, net.IP) bool {
	var names []string
	var ips []net.IP
	var nets []*net.IPNet
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		switch _, subnet, err := net.ParseCIDR(item); {
		case item == "":
		case err == nil:
			nets = append(nets, subnet)
		case net.ParseIP(item) != nil:
			ips = append(ips, net.ParseIP(item))
		default:
			names = append(names, item)
		}
	}
	return func(ifc net.Interface, ip net.IP) bool {
		for _, n := range names {
			if ifc.Name == n {
				return true
			}
		}
		for _, x := range ips {
			if x.Equal(ip) {
				return true
			}
		}
		for _, n := range nets {
			if n.Contains(ip) {
				return true
			}
		}
		return false
	}
}

// loopbackIface returns the loopback interface (its name matters to
// ifaceMatcher), or one named lo when none is listed.
func loopbackIface() net.Interface {
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 {
			return ifc
		}
	}
	return net.Interface{Name: "lo", Flags: net.FlagLoopback}
}

// ifaceIPs returns the addresses of the up interfaces that keep accepts.
func ifaceIPs(keep func(net.Interface, net.IP) bool) ([]net.IP, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []net.IP
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && keep(ifc, n.IP) {
				out = append(out, n.IP)
			}
		}
	}
	return out, nil
}

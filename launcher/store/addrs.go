package store

import "net"

// ReachableAddrs lists host:port, for the port of the listening address
// listen, at every up, non-loopback address of this host (link-local IPv6
// left out), then at loopback: the addresses to hand to clients that may
// run on other hosts, to be tried in order.
func ReachableAddrs(listen string) ([]string, error) {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, err
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
				out = append(out, net.JoinHostPort(ipn.IP.String(), port))
			}
		}
	}
	return append(out, net.JoinHostPort("127.0.0.1", port)), nil
}

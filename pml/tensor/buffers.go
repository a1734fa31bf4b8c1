package tensor

import "github.com/gompi-org/gompi/btl"

// bufPool keeps buffers given back by Recycle (and the serialized bytes
// of string tensors), by size, for later destinations. Guarded by r.mu.
type bufPool struct {
	free  map[int][][]byte
	bytes int
}

const (
	poolPerSize = 16
	poolBytes   = 256 << 20
)

func (p *bufPool) get(n int) []byte {
	if l := p.free[n]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		p.free[n] = l[:len(l)-1]
		p.bytes -= n
		return b
	}
	return make([]byte, n)
}

func (p *bufPool) put(b []byte) {
	n := len(b)
	if n == 0 || p.bytes+n > poolBytes || len(p.free[n]) >= poolPerSize {
		return
	}
	if p.free == nil {
		p.free = map[int][][]byte{}
	}
	p.free[n] = append(p.free[n], b)
	p.bytes += n
}

// proxyBuf is a registered buffer that receives a put for a destination
// the transport could not register; the content is then copied over.
type proxyBuf struct {
	mem []byte
	reg btl.Registration
}

// takeProxyLocked returns a registered proxy of at least n bytes for
// module m: a free one, or a new one.
func (r *Rendezvous) takeProxyLocked(m btl.Module, n int) (*proxyBuf, error) {
	ps := r.proxies[m]
	for i, p := range ps {
		if len(p.mem) >= n {
			ps[i] = ps[len(ps)-1]
			r.proxies[m] = ps[:len(ps)-1]
			return p, nil
		}
	}
	mem := make([]byte, n)
	reg, err := m.Register(mem, btl.AccessRemoteWrite|btl.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	return &proxyBuf{mem: mem, reg: reg}, nil
}

// putProxyLocked keeps a proxy for reuse (a few per module), or releases it.
func (r *Rendezvous) putProxyLocked(m btl.Module, p *proxyBuf) {
	if r.closed || len(r.proxies[m]) >= 4 {
		p.reg.Release()
		return
	}
	r.proxies[m] = append(r.proxies[m], p)
}

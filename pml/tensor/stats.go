package tensor

import "sync/atomic"

// Stats are a rank's counters. Control messages are TENSOR_REQUEST,
// TENSOR_RE_REQUEST, META_DATA_RESPONSE, ERROR_STATUS, CANCEL, CANCELLED,
// ABORT and CLOSED; the notification of a put is counted apart, as the
// immediate value of an RDMA write it stands for.
type Stats struct {
	Requests, ReRequests   int64 // TENSOR_REQUESTs and TENSOR_RE_REQUESTs this rank sent (one per tensor, batched or not)
	CacheHits, CacheMisses int64 // meta-data cache look-ups on this rank's receives
	BytesWritten           int64 // tensor content this rank wrote to peers
	Errors                 int64 // ERROR_STATUS messages sent or received

	MetaResponses   int64 // META_DATA_RESPONSEs this rank sent (one per tensor)
	ControlMessages int64 // control messages this rank sent (a batch counts once)
	Notifications   int64 // NOTIFY messages this rank sent (a batch counts once)
	Puts            int64 // contents this rank wrote with a transport put
	MessageContents int64 // contents this rank sent in messages (the transport could not put)
	ProxyCopies     int64 // receives whose content came through a proxy buffer
	Cancels         int64 // receives given up because their context ended
	Gets            int64 // contents this rank read from the sender's memory (large contents over shared memory)
}

type counters struct {
	requests, reRequests, hits, misses, written, errors        atomic.Int64
	metas, control, notifies, puts, msgContents, proxies, cncl atomic.Int64
	gets                                                       atomic.Int64
	registered                                                 atomic.Int64 // contents registered for remote read (not in Stats: the tests' view)
}

// Stats returns this rank's counters so far.
func (r *Rendezvous) Stats() Stats {
	c := &r.st
	return Stats{
		Requests: c.requests.Load(), ReRequests: c.reRequests.Load(),
		CacheHits: c.hits.Load(), CacheMisses: c.misses.Load(),
		BytesWritten: c.written.Load(), Errors: c.errors.Load(),
		MetaResponses: c.metas.Load(), ControlMessages: c.control.Load(), Notifications: c.notifies.Load(),
		Puts: c.puts.Load(), MessageContents: c.msgContents.Load(), ProxyCopies: c.proxies.Load(), Cancels: c.cncl.Load(),
		Gets: c.gets.Load(),
	}
}

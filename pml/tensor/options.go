package tensor

// Option configures New.
type Option func(*config)

type config struct {
	checksum   bool
	batching   bool
	pullMin    int  // contents of at least this many bytes are read by the receiver where it can (0: never)
	forceProxy bool // tests: every destination goes through a proxy buffer
}

// defaultPullMin is the smallest content a receiver reads itself over a
// transport whose Get finishes within its call: sm's default for sharing
// a Get between both processes (btl_sm_get_split), from which a read is
// faster than the sender's single-process put.
const defaultPullMin = 32 << 10

// WithChecksum turns data validation on or off: every transfer carries a
// CRC-32C of the content, which the receiver verifies; a mismatch fails the
// Recv with ErrChecksum. Give every rank the same setting.
func WithChecksum(on bool) Option { return func(c *config) { c.checksum = on } }

// WithBatching turns the batching of RecvAsync's requests on or off
// (default on). On, a RecvAsync made while other receives from the same
// source are pending leaves its request with the rendezvous's progress
// goroutine, which sends the requests made meanwhile to one source
// together in one TENSOR_REQUEST as soon as it runs (the sender then
// notifies the writes of a batch with one message): hundreds of small
// tensors per step cost a few messages. A request waits only for that
// goroutine to be scheduled, never for a timer; a RecvAsync with nothing
// else pending from its source, and a Recv, send theirs at once (a Recv
// with the batch to its source). Off, every request is sent within its
// call.
func WithBatching(on bool) Option { return func(c *config) { c.batching = on } }

// Package tensor is TensorFlow's receiver-driven tensor rendezvous (the
// design of its verbs transport) on top of gompi's point-to-point layer.
//
// Entry point: New, collective over a communicator, returns a Rendezvous.
// Producers call Send(step, name, tensor), which only puts the tensor in
// this rank's table; consumers call Recv (or RecvAsync) with the step, the
// name and the producing rank, which drives the transfer:
//
//   - The receiver looks the tensor's meta-data (type, shape, deadness,
//     byte size) up in its cache, keyed by source rank and name. On a hit
//     it allocates the destination, registers it with the transport that
//     reaches the source, and sends TENSOR_REQUEST with the handle, the
//     cached meta-data and a request index.
//   - The sender waits for the tensor if it was not sent yet. When the
//     meta-data matches, it writes the content straight into the
//     destination with a transport put and sends a notification naming
//     the request index (over verbs the write's immediate is the
//     notification): one control message and one put per tensor in the
//     steady state. Small contents ride in the notification instead; over
//     shared memory a large one is read by the receiver, whose read both
//     processes copy at once.
//   - When the meta-data differs, or the receiver had none, the sender
//     keeps a copy of the tensor and answers META_DATA_RESPONSE; the
//     receiver updates its cache, allocates and registers a destination of
//     the new size, and sends TENSOR_RE_REQUEST; the sender then writes.
//   - A failure on the sender travels back as ERROR_STATUS and fails that
//     Recv with the sender's message.
//
// String tensors are serialized (they are not DMA-able); dead tensors
// carry no content; over a transport that cannot put, the content travels
// as an MPI message. A destination the transport cannot register gets a
// registered proxy buffer and one copy. WithChecksum adds a CRC-32C of the
// content to every notification, which the receiver verifies.
//
// Control messages are btl fragments of the rendezvous's tag range on the
// endpoint the PML uses for the peer, handled wherever the transport
// delivers them: Recv polls the PML while it waits, as a plain Recv does,
// and handles the answer itself. The PML reports failures, so a dead peer
// fails the receives that wait for it with mpi.ErrProcFailed.
// docs/tensor.md has the message encodings and the sequence diagrams.
//
// Where the code is: rendezvous.go has the Rendezvous type and its
// lifecycle (New, Abort, Close), options.go the options, stats.go the
// counters; send.go has Send and the sender's table, serve.go the
// sender's answers to requests and its writes; recv.go has Recv,
// RecvAsync and the start of a receive, recv_batch.go the batching of
// requests and the progress goroutine, recv_answers.go the receiver's
// handling of the sender's answers, recv_pull.go the receiver's reads;
// failure.go fails what a dead or closed peer leaves; outbox.go runs
// what a handler decided, buffers.go pools recycled destinations and
// registered proxies; tensor.go has the Tensor type; wire.go carries
// control messages as fragments, msg*.go encode them.
//
// The steady state's path allocates no more than a plain Recv's plus the
// returned tensor's shape (TestRecvAllocations): what it needs per tensor
// comes from pools and goes back when nothing refers to
// it (outbox.go's few says why and what it measured; msg.go's recycle,
// and the pools beside Recv, the responses and the sent tensors).
//
// A typical training step:
//
//	rv, _ := tensor.New(world)
//	defer rv.Close()
//	for step := int64(0); step < steps; step++ {
//		rv.Send(step, "grad/w", tensor.Tensor{DType: tensor.Float32, Shape: shape, Data: grad})
//		t, err := rv.Recv(ctx, step, "grad/w", peer)
//		...
//		rv.Recycle(t) // give the buffer back for the next step's Recv
//	}
package tensor

// Package store is the wire-up key-value store of a gompi job, in the manner
// of Gloo's store: gorun runs a Server, and every rank reaches it through a
// Client at the address in $GOMPI_STORE, authenticated with the job secret in
// $GOMPI_SECRET (hex).
//
// Ranks publish their transport addresses with Set and read their peers' with
// Get, which waits at the server until the key exists; Fence is a barrier of
// the whole job. A rank tells gorun that it finished cleanly with Finalize, or
// asks it to end the job with Abort. gorun reports dead peers with
// Server.NotifyFailure; ranks receive them on Client.Failures.
//
// Usage in a rank:
//
//	secret, _ := hex.DecodeString(os.Getenv("GOMPI_SECRET"))
//	c, err := store.Dial(ctx, os.Getenv("GOMPI_STORE"), secret, rank)
//	c.Set("addr/3", myAddr)
//	peer, err := c.Get(ctx, "addr/4")
//	...
//	c.Finalize()
//
// # Protocol
//
// Every connection opens with a handshake in which each side proves, with an
// HMAC-SHA256 over both sides' fresh nonces, that it knows the secret; the
// secret itself never crosses the wire. Then both sides exchange frames:
//
//	u32 body length (little-endian) | u8 kind | u64 request id | payload
//
// Requests carry an id chosen by the client and the answer carries the same
// id, so many requests of one client can be in flight at once. Keys are at
// most MaxKeyLen bytes and values at most MaxValueLen; a peer that sends a
// longer item, an unknown kind, or a truncated frame is dropped and logged,
// and nothing else is affected.
package store

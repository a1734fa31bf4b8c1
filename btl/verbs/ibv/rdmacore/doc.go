//go:build rdmacore && linux && cgo

// Package rdmacore is the verbs provider for real RDMA NICs (InfiniBand,
// RoCE, iWARP): libibverbs from rdma-core through cgo, built only with the
// build tag rdmacore (and cgo on Linux). It implements the btl/verbs/ibv
// model and registers itself as provider "rdmacore".
//
// Memory handed to the NIC stays put while registered: RegMR pins the Go
// slice with a runtime.Pinner until Dereg (the kernel pins its pages in
// ibv_reg_mr). Work requests and their SGEs are built per post in a C
// buffer that the QP reuses, so no Go pointer is passed to C inside C
// data. Completion events are read from the channel's non-blocking fd,
// waited for with poll(2) together with an eventfd that the caller's
// context (or Close) signals. A goroutine per open device reads the
// device's asynchronous events; a CQ_ERR event makes the CQ's Poll return
// ibv.ErrCQOverrun.
//
// The provider checks QP transitions against the RC state table and
// attribute ranges before calling the driver, so that refused
// transitions are ibv.ErrInvalid with nothing changed on every device;
// errno values map to ErrInvalid (EINVAL), ErrNoMem (ENOMEM) and ErrBusy
// (EBUSY). Objects count their users, so destroying one still in use
// (a PD with MRs or QPs, a CQ with QPs or unacknowledged events, a
// channel with CQs, a context with anything) is ErrBusy rather than the
// undefined behaviour of ibv_close_device.
//
// Entry point: New (or ibv.NewProvider("rdmacore", nil)), then
// Provider.Open(device). The usage loop is ibv's.
package rdmacore

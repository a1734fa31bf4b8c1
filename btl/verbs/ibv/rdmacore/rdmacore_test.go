//go:build rdmacore && linux && cgo

package rdmacore_test

import (
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/btl/verbs/ibv/ibvtest"
	"github.com/gompi-org/gompi/btl/verbs/ibv/rdmacore"
)

// device picks the NIC the tests run on: GOMPI_TEST_RDMA_DEVICE, or else
// the first device libibverbs lists; with none, the test is skipped with
// the reason.
func device(t *testing.T, p *rdmacore.Provider) string {
	devs, err := p.Devices()
	name := os.Getenv("GOMPI_TEST_RDMA_DEVICE")
	if err != nil {
		if name != "" {
			t.Fatalf("GOMPI_TEST_RDMA_DEVICE=%s but no device can be listed: %v", name, err)
		}
		t.Skipf("no RDMA device on this machine (%v); set GOMPI_TEST_RDMA_DEVICE on a host with a NIC", err)
	}
	if name == "" {
		t.Logf("GOMPI_TEST_RDMA_DEVICE unset: using %s, the first of %d devices", devs[0].Name, len(devs))
		return devs[0].Name
	}
	return name
}

func TestConformance(t *testing.T) {
	p := rdmacore.New()
	name := device(t, p)
	peer := os.Getenv("GOMPI_TEST_RDMA_PEER_DEVICE")
	port := uint8(1)
	if s := os.Getenv("GOMPI_TEST_RDMA_PORT"); s != "" {
		v, err := strconv.ParseUint(s, 10, 8)
		if err != nil {
			t.Fatalf("GOMPI_TEST_RDMA_PORT=%q: %v", s, err)
		}
		port = uint8(v)
	}
	gid := 0
	if s := os.Getenv("GOMPI_TEST_RDMA_GID_INDEX"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("GOMPI_TEST_RDMA_GID_INDEX=%q: %v", s, err)
		}
		gid = v
	}
	ibvtest.Run(t, ibvtest.Fixture{
		Open: func(t testing.TB, dev int) ibv.Context {
			n := name
			if dev == 1 {
				n = peer
			}
			c, err := p.Open(n)
			if err != nil {
				t.Fatalf("open %s: %v", n, err)
			}
			return c
		},
		TwoDevices: peer != "",
		Port:       port,
		GIDIndex:   gid,
		Skip: map[string]string{
			"CQOverrun": "overrunning a hardware CQ is undefined behaviour in verbs (the device may write past the ring or stop the QPs); only the CQ_ERR async event is mapped to ErrCQOverrun",
		},
	})
}

func TestRegistered(t *testing.T) {
	p, err := ibv.NewProvider("rdmacore", nil)
	if err != nil {
		t.Fatalf("NewProvider(rdmacore): %v", err)
	}
	if p.Name() != "rdmacore" {
		t.Fatalf("provider name %q", p.Name())
	}
}

// Without a device, Devices and Open say so with ErrNoDevice; with one, an
// unknown name is ErrNoDevice too.
func TestNoSuchDevice(t *testing.T) {
	p := rdmacore.New()
	if _, err := p.Open("gompi-no-such-device"); !errors.Is(err, ibv.ErrNoDevice) {
		t.Fatalf("Open of an unknown device: %v, want ErrNoDevice", err)
	}
	if devs, err := p.Devices(); err != nil {
		if !errors.Is(err, ibv.ErrNoDevice) {
			t.Fatalf("Devices: %v, want a list or ErrNoDevice", err)
		}
		t.Logf("no RDMA device: %v", err)
	} else {
		for _, d := range devs {
			t.Logf("device %s: %+v", d.Name, d)
		}
	}
}

package main

import (
	"fmt"
	"io"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/params"
)

// rdmaDevices lists the verbs devices of every built-in ibv provider, as
// ibv_devinfo does: device, provider, node GUID, firmware, and per port
// its state, MTUs, link layer, LID and GID[0].
func rdmaDevices(out io.Writer, set *params.Set) {
	fmt.Fprintln(out, "\nRDMA devices (verbs transport; btl_verbs_provider picks the provider):")
	for _, name := range ibv.ProviderNames() {
		p, err := ibv.NewProvider(name, set)
		if err != nil {
			fmt.Fprintf(out, "  provider %s: %v\n", name, err)
			continue
		}
		devs, err := p.Devices()
		if err != nil || len(devs) == 0 {
			fmt.Fprintf(out, "  provider %s: no device (%v)\n", name, err)
			continue
		}
		for _, d := range devs {
			fmt.Fprintf(out, "  hca_id: %s\n", d.Name)
			fmt.Fprintf(out, "    provider:        %s\n", name)
			fmt.Fprintf(out, "    node_guid:       %04x:%04x:%04x:%04x\n", d.NodeGUID>>48, d.NodeGUID>>32&0xffff, d.NodeGUID>>16&0xffff, d.NodeGUID&0xffff)
			if d.FWVersion != "" {
				fmt.Fprintf(out, "    fw_ver:          %s\n", d.FWVersion)
			}
			fmt.Fprintf(out, "    vendor_id:       %#04x, vendor_part_id: %d, hw_ver: %#x\n", d.VendorID, d.VendorPartID, d.HWVersion)
			fmt.Fprintf(out, "    max_qp: %d, max_qp_wr: %d, max_cqe: %d, max_mr: %d, max_sge: %d, max_inline: %d, max_qp_rd_atom: %d\n",
				d.MaxQP, d.MaxQPWR, d.MaxCQE, d.MaxMR, d.MaxSGE, d.MaxInline, d.MaxQPRdAtom)
			ctx, err := p.Open(d.Name)
			if err != nil {
				fmt.Fprintf(out, "    (cannot open: %v)\n", err)
				continue
			}
			for port := 1; port <= max(1, d.PhysPortCnt); port++ {
				pa, err := ctx.QueryPort(uint8(port))
				if err != nil {
					fmt.Fprintf(out, "    port %d: %v\n", port, err)
					continue
				}
				fmt.Fprintf(out, "    port %d:\n", port)
				fmt.Fprintf(out, "      state:         %v (%d)\n", pa.State, pa.State)
				fmt.Fprintf(out, "      max_mtu:       %d (%d)\n", pa.MaxMTU.Bytes(), pa.MaxMTU)
				fmt.Fprintf(out, "      active_mtu:    %d (%d)\n", pa.ActiveMTU.Bytes(), pa.ActiveMTU)
				fmt.Fprintf(out, "      link_layer:    %s\n", pa.LinkLayer)
				fmt.Fprintf(out, "      port_lid:      %d\n", pa.LID)
				if g, err := ctx.QueryGID(uint8(port), 0); err == nil {
					fmt.Fprintf(out, "      GID[0]:        %s (%x)\n", g, g[:])
				}
			}
			ctx.Close()
		}
	}
}

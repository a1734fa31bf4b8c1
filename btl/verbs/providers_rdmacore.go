//go:build rdmacore && linux && cgo

package verbs

import _ "github.com/gompi-org/gompi/btl/verbs/ibv/rdmacore"

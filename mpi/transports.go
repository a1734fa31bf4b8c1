package mpi

// The transports a process job may use, in addition to self. Each
// registers itself (component and parameters) in its init function.
import (
	_ "github.com/gompi-org/gompi/btl/sm"
	_ "github.com/gompi-org/gompi/btl/tcp"
	_ "github.com/gompi-org/gompi/btl/verbs"
)

package verbs

// The providers the transport can run on register themselves with ibv:
// soft everywhere, rdmacore with its build tag (providers_rdmacore.go).
import _ "github.com/gompi-org/gompi/btl/verbs/ibv/soft"

//go:build !(amd64 || arm64 || 386 || ppc64le || ppc64 || s390x || loong64)

package convertor

// On architectures where unaligned loads may fault the walker uses the safe
// block copies of copy.go.

func gather(out, mem []byte, off, stride, blen, n int) {
	checkRun(len(out), len(mem), off, stride, blen, n)
	gatherSafe(out, mem, off, stride, blen, n)
}

func scatter(mem, in []byte, off, stride, blen, n int) {
	checkRun(len(in), len(mem), off, stride, blen, n)
	scatterSafe(mem, in, off, stride, blen, n)
}

//go:build amd64 && !race

#include "textflag.h"

// func StoreRel64(p *atomic.Uint64, v uint64)
TEXT ·StoreRel64(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET

// func PrefetchW(p *byte)
TEXT ·PrefetchW(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	// PREFETCHW (AX), which the Go assembler does not know: 0F 0D /1
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08
	RET

// func Prefetch(p *byte)
TEXT ·Prefetch(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	PREFETCHT0 (AX)
	RET

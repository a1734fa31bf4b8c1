package pmi

import (
	"fmt"
	"strconv"
	"strings"
)

// block is one (node, nodes, ranks per node) entry of a process mapping:
// ranks are laid out, perNode at a time, on nodes first..first+nodes-1.
type block struct{ first, nodes, perNode int }

// parseMapping decodes a PMI_process_mapping value such as
// "(vector,(0,2,4),(2,1,3))": 4 ranks on each of nodes 0 and 1, then 3 on
// node 2. When the blocks describe fewer ranks than the job has, the
// layout starts over from the first block with the same node numbers
// (hydra describes -n 4 on a host of 1 slot as "(vector,(0,1,1))").
func parseMapping(s string) ([]block, error) {
	s = strings.TrimSpace(s)
	bad := func() ([]block, error) { return nil, fmt.Errorf("%w: process mapping %q", ErrProtocol, clip(s)) }
	if !strings.HasPrefix(s, "(vector,") || !strings.HasSuffix(s, ")") {
		return bad()
	}
	body := s[len("(vector,") : len(s)-1]
	var blocks []block
	for body != "" {
		if body[0] != '(' {
			return bad()
		}
		end := strings.IndexByte(body, ')')
		if end < 0 {
			return bad()
		}
		f := strings.Split(body[1:end], ",")
		if len(f) != 3 {
			return bad()
		}
		var v [3]int
		for i, x := range f {
			n, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil || n < 0 || n > 1<<24 {
				return bad()
			}
			v[i] = n
		}
		if v[1] == 0 || v[2] == 0 {
			return bad()
		}
		blocks = append(blocks, block{v[0], v[1], v[2]})
		if len(blocks) > 1<<16 {
			return bad()
		}
		body = strings.TrimPrefix(body[end+1:], ",")
	}
	if len(blocks) == 0 {
		return bad()
	}
	return blocks, nil
}

// nodeOf returns the node of every rank of a job of size ranks laid out
// by blocks.
func nodeOf(blocks []block, size int) []int {
	nodes := make([]int, 0, size)
	for len(nodes) < size {
		for _, b := range blocks {
			for n := 0; n < b.nodes && len(nodes) < size; n++ {
				for k := 0; k < b.perNode && len(nodes) < size; k++ {
					nodes = append(nodes, b.first+n)
				}
			}
		}
	}
	return nodes
}

// localOf returns rank's local rank and the local size (the ranks on
// its node) given every rank's node.
func localOf(nodes []int, rank int) (local, localSize int) {
	for r, n := range nodes {
		if n != nodes[rank] {
			continue
		}
		if r < rank {
			local++
		}
		localSize++
	}
	return local, localSize
}

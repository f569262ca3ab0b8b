package policy

import (
	"time"
)

type wakeup struct {
	at    time.Time
	token uint32
	check bool // connect-timeout check rather than a retry
}

type wakeHeap []wakeup

func (h wakeHeap) Len() int { return len(h) }

func (h wakeHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }

func (h wakeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *wakeHeap) Push(x any) { *h = append(*h, x.(wakeup)) }

func (h *wakeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

package policy

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// sawtooth is a cubic-like queue: it fills linearly over period and
// drops to a tenth at each loss, starting at phase (0-1 of a period).
func sawtooth(n int, step, period, depth time.Duration, phase float64) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		t := float64(time.Duration(i)*step)/float64(period) + phase
		f := t - math.Floor(t)
		out[i] = time.Duration((0.1 + 0.9*f) * float64(depth))
	}
	return out
}

func noisy(r *rand.Rand, s []time.Duration, sd time.Duration) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, v := range s {
		out[i] = v + time.Duration(r.NormFloat64()*float64(sd))
	}
	return out
}

func TestSharedJudge(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	step := 100 * time.Millisecond
	q := sawtooth(30, step, 1300*time.Millisecond, 120*time.Millisecond, 0)
	for _, tc := range []struct {
		name string
		a, b []time.Duration
		want bool
	}{
		// One queue, seen by both subflows with their own sampling noise.
		{"shared", noisy(r, q, 5*time.Millisecond), noisy(r, q, 5*time.Millisecond), true},
		// One queue, one subflow's smoothed RTT lagging a probe behind.
		{"shared, one lagging", q[1:], q[:len(q)-1], true},
		// Two queues with other periods and phases.
		{"disjoint", q, sawtooth(30, step, 2100*time.Millisecond, 80*time.Millisecond, 0.4), false},
		// Two queues filling in step but of different depth (two
		// bottlenecks whose senders ramp together).
		{"disjoint in step", q, sawtooth(30, step, 1300*time.Millisecond, 30*time.Millisecond, 0), false},
		// One subflow idle: no queue on its path.
		{"idle", q, noisy(r, make([]time.Duration, 30), time.Millisecond), false},
		// Both at the same mean level, independent noise only.
		{"noisy", noisy(r, constant(30, 40*time.Millisecond), 10*time.Millisecond), noisy(r, constant(30, 40*time.Millisecond), 10*time.Millisecond), false},
		// A standing queue that does not move: nothing to correlate.
		{"flat", constant(30, 40*time.Millisecond), constant(30, 40*time.Millisecond), false},
		// Too few samples.
		{"short", q[:5], q[:5], false},
	} {
		v := SharedTest{}.Judge(tc.a, tc.b)
		if v.Shared != tc.want {
			t.Errorf("%s: shared = %v, want %v (%s)", tc.name, v.Shared, tc.want, v.Verdict)
		}
		if v.Verdict == "" {
			t.Errorf("%s: no verdict text", tc.name)
		}
	}
}

func TestSharedThresholds(t *testing.T) {
	q := sawtooth(30, 100*time.Millisecond, 1300*time.Millisecond, 120*time.Millisecond, 0)
	half := make([]time.Duration, len(q))
	for i, v := range q {
		half[i] = v / 2
	}
	// Half the depth: gap 2/3 of the mean; shared only with a looser MaxGap.
	if v := (SharedTest{}).Judge(q, half); v.Shared {
		t.Errorf("default MaxGap: %s", v.Verdict)
	}
	if v := (SharedTest{MaxGap: 0.8}).Judge(q, half); !v.Shared || math.Abs(v.Corr-1) > 1e-9 {
		t.Errorf("MaxGap 0.8: %+v", v)
	}
	// Below MinQueue.
	if v := (SharedTest{MinQueue: time.Second}).Judge(q, q); v.Shared {
		t.Errorf("MinQueue 1s: %s", v.Verdict)
	}
	// Negative samples count as no queue.
	neg := make([]time.Duration, len(q))
	for i := range neg {
		neg[i] = -q[i]
	}
	if v := (SharedTest{}).Judge(q, neg); v.Shared || v.QB != 0 {
		t.Errorf("negative: %+v", v)
	}
}

func constant(n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

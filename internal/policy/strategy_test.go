package policy

import (
	"testing"

	"github.com/mpdetour/mpdetour/internal/detour"
)

func TestModesParseByName(t *testing.T) {
	for _, m := range Modes {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", m.String(), got, err, m)
		}
		if e := New(Config{Mode: m}, nil); e.Mode() != m || e.strat.name() != m.String() {
			t.Errorf("New(%v) runs strategy %q", m, e.strat.name())
		}
	}
	if _, err := ParseMode("dynamic"); err == nil {
		t.Error(`ParseMode("dynamic") accepted an unknown name`)
	}
	if e := New(Config{}, nil); e.Mode() != Static {
		t.Errorf("the default strategy is %v, want static", e.Mode())
	}
}

func TestStaticStrategyKeepsSourcesOrder(t *testing.T) {
	k := &kconn{tried: map[string]bool{Key(d1): true}}
	st := &static{}
	if st.prefer(k, d2, d1) || st.prefer(k, d1, d2) || st.joinAsBackup(k, d1) {
		t.Fatal("static reorders detours or joins as backup")
	}
}

func TestAdaptiveStrategyPrefersUntriedDetours(t *testing.T) {
	k := &kconn{tried: map[string]bool{Key(d1): true}}
	a := &adaptive{}
	if !a.prefer(k, d2, d1) || a.prefer(k, d1, d2) {
		t.Fatal("adaptive does not put the untried detour first")
	}
	if a.joinAsBackup(k, detour.Detour{}) {
		t.Fatal("adaptive joins new detours as backup")
	}
	// Its per-connection state is its own and forgets a gone subflow's trial.
	sk := subKey{remote: d1.Remote}
	a.conn(k).trial = &trial{sub: sk}
	a.gone(k, subKey{remote: d2.Remote})
	if a.conn(k).trial == nil {
		t.Fatal("gone dropped the trial of another subflow")
	}
	a.gone(k, sk)
	if a.conn(k).trial != nil {
		t.Fatal("gone kept the trial of the subflow that went")
	}
}

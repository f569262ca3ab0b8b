package relay

import (
	"fmt"
	"testing"
)

// checkFairnessReport asserts what docs/results/fairness/report.md claims
// of TestFairnessReport's measurements, so the harness cannot pass while its
// numbers say the opposite: no other errors; without receipts neither
// member starves, and the more a member's receipts, the larger its share
// (equal shares within 0.2 without, majority with 64 MiB, >= 80 % with
// 1 GiB); after a clean stop the ledger equals the kernel's counters; a
// kill -9 loses between 0 and one flush period of accounting (1.2 allows
// the rate estimate's error) and the restarted relay starts from the file.
func checkFairnessReport(t *testing.T, res map[string]any) {
	t.Helper()
	for _, p := range fairnessProblems(res) {
		t.Error(p)
	}
}

func fairnessProblems(res map[string]any) []string {
	var out []string
	errorf := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	num := func(m map[string]any, k string) float64 {
		switch v := m[k].(type) {
		case float64:
			return v
		case int64:
			return float64(v)
		case uint64:
			return float64(v)
		case int:
			return float64(v)
		}
		errorf("fairness report: %q is %T, not a number", k, m[k])
		return 0
	}
	minShare := map[string]float64{"share_without_receipts": 0.3, "share_with_small_receipt": 0.5, "share_with_receipts": 0.8}
	for name, min := range minShare {
		r, ok := res[name].(map[string]any)
		if !ok {
			continue // MPDETOUR_FAIRNESS_ONLY=ledger
		}
		c, f := r["contributor"].(map[string]any), r["free-rider"].(map[string]any)
		for who, row := range map[string]map[string]any{"contributor": c, "free-rider": f} {
			if e := num(row, "other_errors"); e != 0 {
				errorf("%s: %s had %v errors other than capacity refusals: %v", name, who, e, r["other_error_kinds"])
			}
		}
		share := num(c, "share_of_grants")
		if name == "share_without_receipts" {
			if share < min || share > 1-min {
				errorf("%s: contributor's share of grants %.3f, want equal shares within 0.2", name, share)
			}
		} else if share < min {
			errorf("%s: contributor's share of grants %.3f, want at least %.2f", name, share, min)
		}
	}
	if l, ok := res["ledger_vs_kernel"].(map[string]any); ok {
		if w := num(l, "worst_relative_difference"); w > 1e-3 {
			errorf("ledger vs kernel after a clean stop: worst relative difference %.4f, want 0 (<= 0.001)", w)
		}
	}
	kills, _ := res["kill9"].([]map[string]any)
	for i, k := range kills {
		lost := num(k, "lost_in_flush_periods")
		if lost < 0 || lost > 1.2 {
			errorf("kill9 #%d: %.2f flush periods lost, want 0..1", i+1, lost)
		}
		if a, b := num(k, "ledger_after_restart"), num(k, "ledger_bytes_in_file"); a != b {
			errorf("kill9 #%d: the restarted relay holds %s bytes, the file %s", i+1, fmt.Sprint(a), fmt.Sprint(b))
		}
	}
	return out
}

// The checks above fail on the numbers they are meant to catch.
func TestCheckFairnessReportFails(t *testing.T) {
	good := func() map[string]any {
		row := func(share float64) map[string]any {
			return map[string]any{"other_errors": int64(0), "share_of_grants": share}
		}
		return map[string]any{
			"share_without_receipts":   map[string]any{"contributor": row(0.47), "free-rider": row(0.53)},
			"share_with_small_receipt": map[string]any{"contributor": row(0.69), "free-rider": row(0.31)},
			"share_with_receipts":      map[string]any{"contributor": row(0.97), "free-rider": row(0.03)},
			"ledger_vs_kernel":         map[string]any{"worst_relative_difference": 0.0},
			"kill9":                    []map[string]any{{"lost_in_flush_periods": 0.6, "ledger_after_restart": uint64(5), "ledger_bytes_in_file": uint64(5)}},
		}
	}
	if p := fairnessProblems(good()); len(p) > 0 {
		t.Fatalf("the report's own numbers fail: %v", p)
	}
	for name, spoil := range map[string]func(map[string]any){
		"starved": func(r map[string]any) {
			r["share_without_receipts"].(map[string]any)["contributor"].(map[string]any)["share_of_grants"] = 0.1
		},
		"receipt unused": func(r map[string]any) {
			r["share_with_receipts"].(map[string]any)["contributor"].(map[string]any)["share_of_grants"] = 0.5
		},
		"errors": func(r map[string]any) {
			r["share_with_receipts"].(map[string]any)["free-rider"].(map[string]any)["other_errors"] = int64(3)
		},
		"ledger":       func(r map[string]any) { r["ledger_vs_kernel"].(map[string]any)["worst_relative_difference"] = 0.02 },
		"kill lost":    func(r map[string]any) { r["kill9"].([]map[string]any)[0]["lost_in_flush_periods"] = 2.5 },
		"kill restore": func(r map[string]any) { r["kill9"].([]map[string]any)[0]["ledger_after_restart"] = uint64(0) },
	} {
		r := good()
		spoil(r)
		if len(fairnessProblems(r)) == 0 {
			t.Errorf("%s: no problem found", name)
		}
	}
}

package results

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func rec(cfg, cell string, trial int, status string, g float64) Record {
	return Record{
		Scenario: "s", Configuration: cfg, Cell: cell, Procedure: strings.Split(cell, "@")[0],
		Trial: trial, Start: time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC), Status: status,
		GoodputMbps: g, CC: "cubic", Duration: 10, Warmup: 1, Params: []string{"profile=core-limited"},
		Versions: map[string]string{"mpdetour": "test", "kernel": "6.18"},
	}
}

func TestStoreAppendLoadResume(t *testing.T) {
	dir := t.TempDir()
	st, old, err := Open(dir, false)
	if err != nil || len(old) != 0 {
		t.Fatalf("Open empty: %v %v", old, err)
	}
	r := rec("a", "mptcp-nat", 1, OK, 18.6)
	r.Subflows = []Subflow{{Path: "default", Local: "10.0.1.1:5000", Remote: "10.0.3.2:5201", Bytes: 11e6, RTTms: 31.2}, {Path: "nat:detour", Bytes: 10e6, RTTms: 62}}
	for _, x := range []Record{r, rec("a", "tcp", 1, OK, 9.5), rec("a", "tcp", 2, Failed, 0), rec("a", "tcp-tunnel", 0, Unavailable, 0)} {
		if err := st.Append(x); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	if _, _, err := Open(dir, false); err == nil || !strings.Contains(err.Error(), "--resume") {
		t.Fatalf("reopening a used directory without resume: %v", err)
	}
	// A crash in the middle of a write leaves a torn last line.
	p := filepath.Join(dir, TrialsFile)
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"scenario":"s","configuration":"a","ce`)
	f.Close()
	st, recs, err := Open(dir, true)
	if err != nil {
		t.Fatalf("resume after torn write: %v", err)
	}
	if len(recs) != 4 || recs[0].Subflows[1].Path != "nat:detour" || recs[0].GoodputMbps != 18.6 {
		t.Fatalf("loaded %+v", recs)
	}
	done := Done(recs)
	if done[Key{"a", "tcp"}] != 2 || done[Key{"a", "mptcp-nat"}] != 1 || done[Key{"a", "tcp-tunnel"}] != 0 {
		t.Fatalf("done %v", done)
	}
	if err := st.Append(rec("a", "tcp", 3, OK, 9.4)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	recs, err = Load(p)
	if err != nil || len(recs) != 5 || recs[4].Trial != 3 {
		t.Fatalf("after resume append: %d records, %v", len(recs), err)
	}
}

func TestLoadRejectsCorruption(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, TrialsFile)
	good := `{"scenario":"s","configuration":"a","cell":"tcp","procedure":"tcp","trial":1,"status":"ok","goodput_mbps":9}` + "\n"
	for name, text := range map[string]string{
		"bad middle line": good + "{not json}\n" + good,
		"unknown status":  strings.Replace(good, `"ok"`, `"great"`, 1),
		"negative":        strings.Replace(good, `:9}`, `:-9}`, 1),
		"no cell":         strings.Replace(good, `"cell":"tcp",`, ``, 1),
		"unknown field":   strings.Replace(good, `"trial"`, `"trail"`, 1),
	} {
		os.WriteFile(p, []byte(text), 0o644)
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p+":") {
			t.Errorf("%s: error %v does not name file and line", name, err)
		}
	}
}

func TestCSV(t *testing.T) {
	r := rec("a", "mptcp-nat", 1, OK, 18.6)
	r.Subflows = []Subflow{{Path: "default", Bytes: 11, RTTms: 31.5, Retrans: 2}, {Path: "nat:detour", Bytes: 10, RTTms: 62}}
	r2 := rec("a,b", "tcp", 1, Failed, 0)
	r2.Reason = `timeout "x"`
	p := filepath.Join(t.TempDir(), CSVFile)
	if err := WriteCSV(p, []Record{r, r2}); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(p)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("CSV does not parse: %v", err)
	}
	if len(rows) != 3 || len(rows[0]) != len(CSVHeader)+12 {
		t.Fatalf("rows %d, columns %d", len(rows), len(rows[0]))
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	if rows[1][col["goodput_mbps"]] != "18.6" || rows[1][col["sf2_path"]] != "nat:detour" || rows[1][col["sf1_retrans"]] != "2" {
		t.Fatalf("row 1: %v", rows[1])
	}
	if rows[2][col["configuration"]] != "a,b" || rows[2][col["reason"]] != `timeout "x"` || rows[2][col["sf1_path"]] != "" {
		t.Fatalf("row 2: %v", rows[2])
	}
	if rows[1][col["versions"]] != "kernel=6.18 mpdetour=test" {
		t.Fatalf("versions %q", rows[1][col["versions"]])
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"scenario":"s","configuration":"a","cell":"tcp","procedure":"tcp","trial":1,"status":"ok","goodput_mbps":9}` + "\n"))
	f.Add([]byte("{}\n{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := parse("fuzz", b)
		if err != nil {
			return
		}
		for _, r := range recs {
			if r.check() != nil {
				t.Fatalf("accepted a bad record %+v", r)
			}
		}
		if err := EncodeCSV(new(strings.Builder), recs); err != nil {
			t.Fatalf("CSV of accepted records: %v", err)
		}
	})
}

// TestEqualWindowFields: a record with the equal-window fields round-trips
// through the log and the CSV; one written before they existed still
// loads, with them nil (not 0), and gets empty CSV cells.
func TestEqualWindowFields(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, TrialsFile)
	// A record as committed before the fields existed.
	old := `{"scenario":"design","configuration":"p058","cell":"tcp-path1","procedure":"tcp-path1","trial":1,"start":"2026-11-20T10:00:00Z","status":"ok","goodput_mbps":7.32,"window_bytes":8500000,"params":[],"cc":"cubic","duration_s":10,"warmup_s":1,"versions":{},"loadavg_1m":2}` + "\n"
	if err := os.WriteFile(p, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	st, recs, err := Open(dir, true)
	if err != nil || len(recs) != 1 {
		t.Fatalf("old record: %v %v", recs, err)
	}
	if recs[0].WindowS != nil || recs[0].EqualBytes != nil || recs[0].EqualGoodputMbps != nil {
		t.Fatalf("old record got equal-window fields: %+v", recs[0])
	}
	r := rec("p058", "mptcp-1sf", 1, OK, 2.9)
	ws, eb, eg := 14.5, uint64(3_600_000), 3.2
	r.WindowS, r.EqualBytes, r.EqualGoodputMbps = &ws, &eb, &eg
	if err := st.Append(r); err != nil {
		t.Fatal(err)
	}
	st.Close()
	recs, err = Load(p)
	if err != nil || len(recs) != 2 {
		t.Fatalf("load: %v %v", recs, err)
	}
	if n := recs[1]; n.WindowS == nil || *n.WindowS != 14.5 || *n.EqualBytes != 3_600_000 || *n.EqualGoodputMbps != 3.2 {
		t.Fatalf("new record: %+v", n)
	}
	var b strings.Builder
	if err := EncodeCSV(&b, recs); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, h := range []string{"window_s", "equal_bytes", "equal_goodput_mbps"} {
		if rows[1][col[h]] != "" {
			t.Errorf("old record: %s = %q, want empty", h, rows[1][col[h]])
		}
	}
	if rows[2][col["window_s"]] != "14.5" || rows[2][col["equal_bytes"]] != "3600000" || rows[2][col["equal_goodput_mbps"]] != "3.2" {
		t.Errorf("new record's CSV row: %v", rows[2])
	}
	// A negative equal goodput is a corrupt record.
	bad := strings.Replace(old, `"goodput_mbps":7.32`, `"goodput_mbps":7.32,"equal_goodput_mbps":-1`, 1)
	if _, err := parse("x", []byte(bad)); err == nil || !strings.Contains(err.Error(), "equal_goodput_mbps") {
		t.Errorf("negative equal goodput: %v", err)
	}
}
